/**
 * api/proxy — the Proxy resource, defined once: the TypeScript types, the runtime validator
 * (api/validate) and the CRD's openAPIV3Schema (api/crd) all come from these schemas.
 * Cross-field rules are attached as `x-kubernetes-validations` CEL; api/rules holds the same
 * rules as TypeScript for standalone mode, and the tests evaluate both against one table.
 */
import Type from 'typebox';
import { DEFAULT_PROXY_PORT } from './constants.ts';
import { LOCATION_VALUE_PATTERN, type Location, MAX_LOCATION_VALUE } from './location.ts';
import { ConditionSchema, ObjectMetaSchema } from './meta.ts';
import {
  CLOUD_INIT_RULES,
  celValidations,
  HEALTH_CHECK_RULES,
  PROVIDER_RULES,
  SPEC_RULES,
  TYPE_RULES,
} from './rules.ts';

const LocationValue = (description: string) =>
  Type.String({ minLength: 1, maxLength: MAX_LOCATION_VALUE, pattern: LOCATION_VALUE_PATTERN, description });

/** The status schema of api/location's Location (the types are checked equal below). */
export const LocationSchema = Type.Object(
  {
    region: Type.Optional(
      LocationValue(
        "Region the instance runs in, where its provider knows one (kubernetes: the node's topology label; gcp: from the zone).",
      ),
    ),
    zone: Type.Optional(
      LocationValue(
        "Zone the instance runs in (kubernetes: the node's topology label; gcp: the zone; kvm: the host; local: the machine).",
      ),
    ),
  },
  {
    additionalProperties: false,
    description:
      "Where the current instance runs, as its provider reports it (written by the reconciler). Lease selectors and the gateway's region-/zone- options match it as the labels topology.kubernetes.io/region and topology.kubernetes.io/zone.",
  },
);

const _locationMatchesSchema: [Location, Type.Static<typeof LocationSchema>] extends [
  Type.Static<typeof LocationSchema>,
  Location,
]
  ? true
  : never = true;
void _locationMatchesSchema;

const Port = (description: string) => Type.Integer({ minimum: 1, maximum: 65535, description });
const Name = (description: string, extra: Record<string, unknown> = {}) =>
  Type.String({ minLength: 1, maxLength: 253, description, ...extra });

export const PROXY_TYPES = ['Managed', 'External'] as const;
export type ProxyType = (typeof PROXY_TYPES)[number];

export const SecretKeyRefSchema = Type.Object(
  {
    name: Name('Name of a Secret in the Proxy namespace.'),
    key: Type.String({ minLength: 1, maxLength: 253, description: 'Key inside the Secret.' }),
  },
  { additionalProperties: false },
);

export const CloudInitSchema = Type.Object(
  {
    inline: Type.Optional(Type.String({ description: 'cloud-init user-data, verbatim.' })),
    secretRef: Type.Optional(SecretKeyRefSchema),
  },
  {
    additionalProperties: false,
    description:
      'cloud-init user-data for the instance; exactly one of inline or secretRef. A referenced Secret must carry the label crawl.example.com/cloud-init: "true".',
    'x-kubernetes-validations': celValidations(CLOUD_INIT_RULES),
  },
);

export const PlacementSchema = Type.Object(
  {
    zone: Type.Optional(Type.String({ maxLength: 253, description: 'Zone or host, per provider.' })),
    machineType: Type.Optional(
      Type.String({ maxLength: 253, description: 'Machine type or resource profile.' }),
    ),
    image: Type.Optional(Type.String({ maxLength: 2048, description: 'Image key or URL, per provider.' })),
  },
  { additionalProperties: false },
);

export const EndpointSchema = Type.Object(
  {
    host: Type.String({
      minLength: 1,
      maxLength: 253,
      description: 'Host name or IP of the external proxy.',
    }),
    port: Port('Port of the external proxy.'),
  },
  { additionalProperties: false },
);

export const HealthCheckSchema = Type.Object(
  {
    url: Type.Optional(
      Type.String({
        pattern: '^https?://[^\\s/]+',
        maxLength: 2048,
        description: 'http(s) URL fetched through the proxy. Default: the engine-wide probe URL.',
      }),
    ),
    expectStatus: Type.Optional(
      Type.Integer({ minimum: 100, maximum: 599, description: 'HTTP status the probe URL must answer.' }),
    ),
    intervalSeconds: Type.Optional(
      Type.Integer({ minimum: 1, maximum: 3600, description: 'Seconds between probes. Default 1.' }),
    ),
    timeoutSeconds: Type.Optional(
      Type.Integer({
        minimum: 1,
        maximum: 3600,
        description: 'Seconds before a probe counts as failed; less than intervalSeconds × failureThreshold.',
      }),
    ),
    failureThreshold: Type.Optional(
      Type.Integer({
        minimum: 1,
        maximum: 1000,
        description: 'Consecutive failures before the proxy is Unhealthy. Default 3.',
      }),
    ),
    successThreshold: Type.Optional(
      Type.Integer({
        minimum: 1,
        maximum: 1000,
        description: 'Consecutive successes before the proxy is Healthy again. Default 1.',
      }),
    ),
  },
  {
    additionalProperties: false,
    description: 'Per-proxy overrides of the health engine defaults.',
    'x-kubernetes-validations': celValidations(HEALTH_CHECK_RULES),
  },
);

export const ProxySpecSchema = Type.Object(
  {
    type: Type.Optional(
      Type.Enum(PROXY_TYPES, {
        default: 'Managed',
        description:
          'Managed: provisioned by a provider. External: an existing proxy at spec.endpoint. Immutable.',
        'x-kubernetes-validations': celValidations(TYPE_RULES),
      }),
    ),
    provider: Type.Optional(
      Name('Managed only: a provider name from the providers config. Immutable.', {
        'x-kubernetes-validations': celValidations(PROVIDER_RULES),
      }),
    ),
    placement: Type.Optional(PlacementSchema),
    cloudInit: Type.Optional(CloudInitSchema),
    port: Type.Optional(
      Type.Integer({
        minimum: 1,
        maximum: 65535,
        default: DEFAULT_PROXY_PORT,
        description: `Port the proxy listens on. Default ${DEFAULT_PROXY_PORT}.`,
      }),
    ),
    endpoint: Type.Optional(EndpointSchema),
    credentialsSecretRef: Type.Optional(
      Type.Object({ name: Name('Secret with keys username and password.') }, { additionalProperties: false }),
    ),
    credentialsRotation: Type.Optional(
      Type.Object(
        {
          intervalSeconds: Type.Integer({
            minimum: 3600,
            maximum: 31_536_000,
            description:
              'Seconds between rotations of the generated credentials (1 h to 365 days); each one replaces the instance through the health gate.',
          }),
        },
        {
          additionalProperties: false,
          description:
            'Managed, generated credentials only: replace the <proxy>-auth credentials on a schedule.',
        },
      ),
    ),
    maxLeases: Type.Optional(Type.Integer({ minimum: 0, description: 'Concurrent leases; 0 = unlimited.' })),
    drain: Type.Optional(Type.Boolean({ description: 'true: keep running, stop handing out.' })),
    healthCheck: Type.Optional(HealthCheckSchema),
  },
  {
    additionalProperties: false,
    description: 'Desired state of the Proxy.',
    'x-kubernetes-validations': celValidations(SPEC_RULES),
  },
);
export type ProxySpec = Type.Static<typeof ProxySpecSchema>;

export const PROXY_PHASES = [
  'Pending',
  'Provisioning',
  'Ready',
  'Replacing',
  'Restarting',
  'Failed',
  'Deleting',
] as const;
export type ProxyPhase = (typeof PROXY_PHASES)[number];

export const ProxyHealthSchema = Type.Object(
  {
    latencyMillis: Type.Optional(Type.Integer({ minimum: 0, description: 'Latency of the last probe.' })),
    lastProbeTime: Type.Optional(Type.String({ format: 'date-time' })),
    consecutiveFailures: Type.Optional(Type.Integer({ minimum: 0 })),
    lastError: Type.Optional(Type.String({ description: 'Reason and detail of the last failed probe.' })),
  },
  { description: 'Health as of the last written verdict.' },
);
export type ProxyHealth = Type.Static<typeof ProxyHealthSchema>;

const Generation = (description: string) => Type.Integer({ minimum: 1, description });

export const PendingInstanceSchema = Type.Object(
  {
    providerID: Type.String({ description: "The provider's ID of the replacement instance." }),
    instanceName: Type.String({ description: 'Deterministic name of the replacement instance.' }),
    address: Type.Optional(
      Type.String({ description: 'Where the replacement answers, once the provider reports one.' }),
    ),
    port: Type.Optional(Type.Integer({ description: 'Port of the replacement.' })),
    credentialsGeneration: Type.Optional(Generation('Credentials generation the replacement serves.')),
  },
  {
    description:
      'A replacement instance not serving leases yet (written by the reconciler): probed by the health engine, switched to once it passes.',
  },
);
export type PendingInstance = Type.Static<typeof PendingInstanceSchema>;

export const ReplacementHealthSchema = Type.Object(
  {
    providerID: Type.String({ description: 'The replacement instance this verdict is about.' }),
    healthy: Type.Boolean({ description: 'true once it passed successThreshold probes in a row.' }),
    lastProbeTime: Type.Optional(Type.String({ format: 'date-time' })),
    lastError: Type.Optional(Type.String({ description: 'Reason and detail of the last failed probe.' })),
  },
  { description: "The health engine's verdict on status.pending (written by the health engine only)." },
);
export type ReplacementHealth = Type.Static<typeof ReplacementHealthSchema>;

export const DrainingInstanceSchema = Type.Object(
  {
    providerID: Type.String({ description: "The provider's ID of the replaced instance." }),
    address: Type.Optional(Type.String()),
    port: Type.Optional(Type.Integer()),
    credentialsGeneration: Type.Optional(Generation('Credentials generation it serves.')),
    since: Type.String({ format: 'date-time', description: 'When it stopped getting new leases.' }),
  },
  {
    description:
      'A replaced instance that gets no new leases and is deleted once its leases end, at most --drain-timeout after `since`.',
  },
);
export type DrainingInstance = Type.Static<typeof DrainingInstanceSchema>;

export const RESTART_PHASES = ['Draining', 'Restarting', 'Done', 'Failed'] as const;
export type RestartPhase = (typeof RESTART_PHASES)[number];

export const RestartStatusSchema = Type.Object(
  {
    requestedAt: Type.String({
      description: 'The request this restart answers (the crawl.example.com/restart-requested annotation).',
    }),
    phase: Type.Enum(RESTART_PHASES, {
      description:
        'Draining: no new leases, waiting for the live ones (at most --drain-timeout). Restarting: the instance is stopped and started, serving nothing. Done: it serves at its new address (leased again once its health checks pass). Failed: see message.',
    }),
    since: Type.String({ format: 'date-time', description: 'When the phase began.' }),
    previousAddress: Type.Optional(Type.String({ description: 'The address before the restart.' })),
    finishedAt: Type.Optional(
      Type.String({ format: 'date-time', description: 'When the instance served again (phase Done).' }),
    ),
    message: Type.Optional(Type.String({ description: 'Why it failed, or what it waits for.' })),
  },
  {
    description:
      'The last in-place restart of the instance for a new IP (pool rotation strategy Restart), written by the reconciler.',
  },
);
export type RestartStatus = Type.Static<typeof RestartStatusSchema>;

export const ProxyStatusSchema = Type.Object(
  {
    phase: Type.Optional(Type.Enum(PROXY_PHASES, { description: 'Lifecycle phase.' })),
    providerID: Type.Optional(
      Type.String({ description: "The provider's self-contained ID of the current instance." }),
    ),
    instanceName: Type.Optional(Type.String({ description: 'Deterministic name of the current instance.' })),
    address: Type.Optional(Type.String({ description: 'Host or IP clients connect to.' })),
    port: Type.Optional(Type.Integer({ description: 'Port clients connect to.' })),
    url: Type.Optional(Type.String({ description: 'Proxy URL without credentials.' })),
    credentialsGeneration: Type.Optional(
      Generation(
        'Credentials generation the current instance serves (the reconciler keeps each generation in use in the <proxy>-served-credentials Secret).',
      ),
    ),
    credentialsRotatedAt: Type.Optional(
      Type.String({
        format: 'date-time',
        description:
          'When spec.credentialsRotation last replaced the generated credentials (or started counting).',
      }),
    ),
    pending: Type.Optional(PendingInstanceSchema),
    restart: Type.Optional(RestartStatusSchema),
    replacementHealth: Type.Optional(ReplacementHealthSchema),
    draining: Type.Optional(
      Type.Array(DrainingInstanceSchema, {
        'x-kubernetes-list-type': 'map',
        'x-kubernetes-list-map-keys': ['providerID'],
        description: 'Replaced instances waiting for their leases to end before deletion.',
      }),
    ),
    retiring: Type.Optional(
      Type.Array(Type.String(), {
        'x-kubernetes-list-type': 'set',
        description: 'providerIDs of replaced instances still being deleted.',
      }),
    ),
    conditions: Type.Optional(
      Type.Array(ConditionSchema, {
        'x-kubernetes-list-type': 'map',
        'x-kubernetes-list-map-keys': ['type'],
        description: 'Provisioned (reconciler) and Healthy (health engine).',
      }),
    ),
    health: Type.Optional(ProxyHealthSchema),
    egressIP: Type.Optional(
      Type.String({
        description:
          'Source address of the upstream traffic: assigned by the local provider (egressAddresses) or reported by the optional egress-IP check. Proxies sharing it share per-target blocked cooldowns.',
      }),
    ),
    location: Type.Optional(LocationSchema),
    observedGeneration: Type.Optional(Type.Integer()),
    message: Type.Optional(Type.String({ description: 'Human-readable detail of the current phase.' })),
  },
  { description: 'Observed state, written by the operator.' },
);
export type ProxyStatus = Type.Static<typeof ProxyStatusSchema>;

export const ProxySchema = Type.Object(
  {
    apiVersion: Type.String(),
    kind: Type.String(),
    metadata: ObjectMetaSchema,
    spec: ProxySpecSchema,
    status: Type.Optional(ProxyStatusSchema),
  },
  {
    description:
      'An authenticated HTTP forward proxy: provisioned by a provider (Managed) or an existing one (External), health-checked and leased to crawlers.',
  },
);
/** Named ProxyObject so it never shadows the global `Proxy`. */
export type ProxyObject = Type.Static<typeof ProxySchema>;

/** Spec with defaults applied: what the controller and health engine reason about. */
export function proxyType(spec: ProxySpec): ProxyType {
  return spec.type ?? 'Managed';
}

/**
 * True in the phases whose status.address reaches a serving instance: `Ready`, and `Replacing`,
 * where the old instance keeps serving until the switch (capacity never drops to zero during a
 * rotation; see docs/architecture.md). Leasing and health probing both go by this.
 */
export function phaseServes(phase: string | undefined): boolean {
  return phase === 'Ready' || phase === 'Replacing';
}

/**
 * Where a proxy serves, or undefined when it is not to be probed or leased: an External proxy at
 * its spec.endpoint; a Managed one at status.address while its phase serves. Deleting proxies
 * serve nowhere.
 */
export function servingEndpoint(proxy: ProxyObject): { host: string; port: number } | undefined {
  if (proxy.metadata.deletionTimestamp) return undefined;
  if (proxyType(proxy.spec) === 'External') {
    return proxy.spec.endpoint
      ? { host: proxy.spec.endpoint.host, port: proxy.spec.endpoint.port }
      : undefined;
  }
  const s = proxy.status;
  if (!phaseServes(s?.phase) || !s?.address) return undefined;
  return { host: s.address, port: s.port ?? proxy.spec.port ?? DEFAULT_PROXY_PORT };
}
