/**
 * config/schema — the providers config file (YAML): one entry per provider instance with a
 * type-specific block. Shapes only; config/validate adds the rules a schema cannot express
 * and turns every problem into a message naming the field path.
 */
import Type from 'typebox';

export const PROVIDER_TYPES = ['kubernetes', 'gcp', 'kvm', 'local', 'aws'] as const;
export type ProviderType = (typeof PROVIDER_TYPES)[number];

const strict = { additionalProperties: false } as const;

/**
 * What a lease holder may reach through this provider's proxies (docs/operations.md, "Security
 * model"). Every provider type carries the same block; config/egress applies the defaults.
 */
export const EgressPolicySchema = Type.Object(
  {
    allowCIDRs: Type.Optional(
      Type.Array(Type.String(), {
        description: 'Ranges taken out of the default deny list (a lab probing a loopback origin).',
      }),
    ),
    denyCIDRs: Type.Optional(
      Type.Array(Type.String(), {
        description: 'Ranges denied on top of the defaults; they win over allowCIDRs.',
      }),
    ),
    connectPorts: Type.Optional(
      Type.Array(Type.Integer(), { description: 'Ports CONNECT may reach. Default [443].' }),
    ),
  },
  strict,
);
const egressPolicy = Type.Optional(EgressPolicySchema);

export const KubernetesProviderConfigSchema = Type.Object(
  {
    namespace: Type.Optional(
      Type.String({ description: 'Namespace for proxy Pods. Default: the operator namespace.' }),
    ),
    image: Type.Optional(Type.String({ description: 'Squid container image. Default ubuntu/squid.' })),
    imagePullPolicy: Type.Optional(
      Type.Union([Type.Literal('Always'), Type.Literal('IfNotPresent'), Type.Literal('Never')]),
    ),
    maxFileDescriptors: Type.Optional(Type.Integer({ minimum: 64, maximum: 1048576 })),
    zoneLabel: Type.Optional(
      Type.String({
        description: 'Node label used for placement.zone. Default topology.kubernetes.io/zone.',
      }),
    ),
    egressPolicy,
    resourceProfiles: Type.Optional(
      Type.Record(
        Type.String(),
        Type.Object(
          {
            cpu: Type.Optional(Type.String()),
            memory: Type.Optional(Type.String()),
          },
          strict,
        ),
      ),
    ),
  },
  strict,
);
export type KubernetesProviderConfig = Type.Static<typeof KubernetesProviderConfigSchema>;

export const GcpProviderConfigSchema = Type.Object(
  {
    project: Type.String(),
    credentialsFile: Type.Optional(Type.String()),
    network: Type.Optional(Type.String()),
    subnetwork: Type.Optional(Type.String()),
    serviceAccountEmail: Type.Optional(Type.String()),
    diskSizeGb: Type.Optional(Type.Integer({ minimum: 10, maximum: 65536 })),
    spot: Type.Optional(Type.Boolean()),
    images: Type.Optional(Type.Record(Type.String(), Type.String())),
    firewall: Type.Optional(
      Type.Object(
        {
          enabled: Type.Optional(Type.Boolean()),
          sourceRanges: Type.Array(Type.String()),
          targetTag: Type.Optional(Type.String()),
        },
        strict,
      ),
    ),
    egressPolicy,
    /** Tests: point the client at a local server. */
    apiEndpoint: Type.Optional(Type.String()),
  },
  strict,
);
export type GcpProviderConfig = Type.Static<typeof GcpProviderConfigSchema>;

export const KVM_IMAGE_FORMATS = ['qcow2', 'raw'] as const;
export const KVM_FIRMWARES = ['uefi', 'bios'] as const;

export const KvmImageSchema = Type.Object(
  {
    url: Type.String({ description: 'http(s) URL of a cloud image (qcow2 or raw).' }),
    sha256: Type.Optional(Type.String({ description: 'Expected digest, 64 hex characters.' })),
    format: Type.Optional(Type.Enum(KVM_IMAGE_FORMATS, { description: 'Default qcow2.' })),
    firmware: Type.Optional(Type.Enum(KVM_FIRMWARES, { description: 'Default uefi.' })),
    kernel: Type.Optional(
      Type.String({
        description:
          'Direct kernel boot: absolute path of a kernel on every host; the disk then needs no bootloader.',
      }),
    ),
    initrd: Type.Optional(
      Type.String({ description: 'Direct kernel boot: absolute path of the initrd on every host.' }),
    ),
    cmdline: Type.Optional(
      Type.String({
        description: 'Direct kernel boot: the kernel command line, e.g. root=/dev/vda rw console=ttyS0.',
      }),
    ),
  },
  strict,
);
export type KvmImage = Type.Static<typeof KvmImageSchema>;
export const KvmHostSchema = Type.Object(
  {
    name: Type.String(),
    address: Type.String(),
    user: Type.String(),
    bridge: Type.String(),
    socket: Type.Optional(Type.String()),
    pool: Type.Optional(Type.String()),
  },
  strict,
);
export type KvmHost = Type.Static<typeof KvmHostSchema>;
export const KvmProviderConfigSchema = Type.Object(
  {
    sshKeyFile: Type.String(),
    knownHostsFile: Type.Optional(Type.String()),
    insecureIgnoreHostKey: Type.Optional(Type.Boolean()),
    diskSizeGb: Type.Optional(Type.Integer({ minimum: 1, maximum: 65536 })),
    vendorData: Type.Optional(Type.String()),
    installGuestAgent: Type.Optional(Type.Boolean()),
    domainType: Type.Optional(Type.Union([Type.Literal('kvm'), Type.Literal('qemu')])),
    images: Type.Optional(Type.Record(Type.String(), KvmImageSchema)),
    machineTypes: Type.Record(
      Type.String(),
      Type.Object({ vcpus: Type.Integer({ minimum: 1 }), memoryMiB: Type.Integer({ minimum: 64 }) }, strict),
    ),
    hosts: Type.Array(KvmHostSchema),
    egressPolicy,
  },
  strict,
);
export type KvmProviderConfig = Type.Static<typeof KvmProviderConfigSchema>;

export const LocalProviderConfigSchema = Type.Object(
  {
    bindAddress: Type.Optional(
      Type.String({ description: 'Address the proxies listen on. Default 127.0.0.1.' }),
    ),
    advertiseAddress: Type.Optional(
      Type.String({ description: 'Address published in status. Default: bindAddress.' }),
    ),
    portRange: Type.Optional(
      Type.Object(
        {
          from: Type.Integer({ minimum: 1, maximum: 65535 }),
          to: Type.Integer({ minimum: 1, maximum: 65535 }),
        },
        strict,
      ),
    ),
    egressAddresses: Type.Optional(
      Type.Union(
        [
          Type.Array(Type.String(), { description: 'Source addresses, one per proxy.' }),
          Type.Object(
            {
              cidr: Type.String({ description: 'An IPv4 or IPv6 block such as 203.0.113.8/29.' }),
              count: Type.Integer({ description: 'How many addresses of the block to use (at least 1).' }),
            },
            strict,
          ),
        ],
        {
          description:
            'Source addresses the proxies connect from, one per proxy (docs/providers/local.md). Default: none (the system picks).',
        },
      ),
    ),
    egressPolicy,
  },
  strict,
);
export type LocalEgressAddresses = NonNullable<LocalProviderConfig['egressAddresses']>;
export type LocalProviderConfig = Type.Static<typeof LocalProviderConfigSchema>;

export const AWS_MARKETS = ['on-demand', 'spot'] as const;

/** One region of an aws provider entry: its subnets (one per zone, tried in order) and groups. */
export const AwsRegionSchema = Type.Object(
  {
    name: Type.String({ description: 'Region, e.g. eu-west-1.' }),
    subnets: Type.Array(
      Type.Object(
        {
          id: Type.String({ description: 'Subnet ID, e.g. subnet-0abc….' }),
          zone: Type.String({
            description: 'Its availability zone, e.g. eu-west-1a (placement.zone names it).',
          }),
        },
        strict,
      ),
      { description: 'Tried in order: on insufficient capacity the next one.' },
    ),
    securityGroupIds: Type.Optional(
      Type.Array(Type.String(), {
        description: 'Security groups to use instead of the managed one (aws.securityGroup).',
      }),
    ),
  },
  strict,
);
export type AwsRegion = Type.Static<typeof AwsRegionSchema>;

export const AwsProviderConfigSchema = Type.Object(
  {
    regions: Type.Array(AwsRegionSchema, {
      description: 'The first is used when placement.zone is not set.',
    }),
    profile: Type.Optional(
      Type.String({ description: 'Named profile of the shared AWS config. Default: the SDK default chain.' }),
    ),
    instanceTypes: Type.Optional(
      Type.Record(Type.String(), Type.String(), {
        description:
          'Machine classes (placement.machineType) → instance types; `default` when none is named.',
      }),
    ),
    images: Type.Optional(
      Type.Record(Type.String(), Type.String(), {
        description:
          'Image keys (placement.image) → an AMI id or ssm:<public parameter>; `default` when none is named.',
      }),
    ),
    securityGroup: Type.Optional(
      Type.Object(
        {
          sourceRanges: Type.Array(Type.String(), {
            description: 'CIDR ranges the managed group admits to the proxy port.',
          }),
        },
        strict,
      ),
    ),
    publicIPv4: Type.Optional(Type.Boolean({ description: 'A public IPv4 address. Default true.' })),
    ipv6: Type.Optional(
      Type.Boolean({ description: 'An IPv6 address (the subnet needs an IPv6 range). Default false.' }),
    ),
    market: Type.Optional(Type.Enum(AWS_MARKETS, { description: 'Default on-demand.' })),
    maxPrice: Type.Optional(
      Type.String({
        description: 'Spot only: the highest hourly price in USD, e.g. "0.01". Default: on-demand price.',
      }),
    ),
    egressPolicy,
    endpoint: Type.Optional(
      Type.String({ description: 'Testing and EC2-compatible endpoints only: the EC2 (and SSM) API URL.' }),
    ),
  },
  strict,
);
export type AwsProviderConfig = Type.Static<typeof AwsProviderConfigSchema>;

export const ProviderEntrySchema = Type.Object(
  {
    name: Type.String(),
    type: Type.Enum(PROVIDER_TYPES),
    kubernetes: Type.Optional(KubernetesProviderConfigSchema),
    gcp: Type.Optional(GcpProviderConfigSchema),
    kvm: Type.Optional(KvmProviderConfigSchema),
    local: Type.Optional(LocalProviderConfigSchema),
    aws: Type.Optional(AwsProviderConfigSchema),
  },
  strict,
);
export type ProviderEntry = Type.Static<typeof ProviderEntrySchema>;

export const GATEWAY_RULE_ACTIONS = ['retry', 'block', 'rateLimit', 'fail'] as const;

/**
 * One response rule of the gateway (docs/gateway.md, "Rules"): conditions that must all hold
 * (at least one besides `hosts`), and what to do when they do. config/validate checks what
 * the shape cannot (regular expressions, globs, unique names, clamps).
 */
export const GatewayRuleSchema = Type.Object(
  {
    name: Type.String({
      description: 'Unique; lowercase letters, digits and "-". Metrics and spans name it.',
    }),
    hosts: Type.Optional(
      Type.Array(Type.String(), {
        description: 'Host globs (`*` any characters, `*.shop.test` its subdomains). Default: every host.',
      }),
    ),
    status: Type.Optional(Type.Array(Type.Integer(), { description: 'Response statuses that match.' })),
    header: Type.Optional(
      Type.Object(
        {
          name: Type.String({ description: 'Response header name (any case).' }),
          pattern: Type.String({ description: 'Regular expression on its value (several joined by ", ").' }),
        },
        strict,
      ),
    ),
    body: Type.Optional(
      Type.String({
        description:
          'Regular expression on the first 64 KiB of the body after gzip/deflate/br decoding; a leading (?i) ignores case.',
      }),
    ),
    timeToFirstByteMs: Type.Optional(
      Type.Integer({
        description: 'Matches when the response head takes longer, or the upstream times out.',
      }),
    ),
    actions: Type.Array(Type.Enum(GATEWAY_RULE_ACTIONS), { description: 'retry, block, rateLimit, fail.' }),
    retries: Type.Optional(Type.Integer({ description: 'Retries at most (`retry`). Default 2.' })),
    retryUnsafe: Type.Optional(
      Type.Boolean({ description: 'Retry non-idempotent methods too (POST, PATCH). Default false.' }),
    ),
    rateLimit: Type.Optional(
      Type.Object(
        {
          defaultSeconds: Type.Optional(
            Type.Integer({ description: 'Cooldown without Retry-After. Default 60.' }),
          ),
          minSeconds: Type.Optional(
            Type.Integer({ description: 'Retry-After below is raised to it. Default 1.' }),
          ),
          maxSeconds: Type.Optional(
            Type.Integer({ description: 'Retry-After above is cut to it. Default 3600.' }),
          ),
        },
        strict,
      ),
    ),
    mode: Type.Optional(
      Type.Enum(['enforce', 'observe'] as const, {
        description: 'observe: count matches only. Default enforce.',
      }),
    ),
  },
  strict,
);
export type GatewayRuleConfig = Type.Static<typeof GatewayRuleSchema>;

/** The gateway's own settings (docs/gateway.md): what its clients may reach, and its response rules. */
export const GatewayConfigSchema = Type.Object(
  { egressPolicy, rules: Type.Optional(Type.Array(GatewayRuleSchema)) },
  strict,
);
export type GatewayConfig = Type.Static<typeof GatewayConfigSchema>;

export const ProvidersConfigSchema = Type.Object(
  { providers: Type.Array(ProviderEntrySchema), gateway: Type.Optional(GatewayConfigSchema) },
  strict,
);
export type ProvidersConfig = Type.Static<typeof ProvidersConfigSchema>;
