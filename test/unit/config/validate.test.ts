/**
 * test/unit/config/validate — one passing and one failing case per providers-config rule. Each
 * failing case names the exact field path and the words a user needs to fix it.
 */
import { describe, expect, it } from 'vitest';
import { validateProvidersConfig } from '../../../src/config/validate.ts';

type Obj = Record<string, unknown>;

const k8s = (kubernetes?: Obj): Obj => ({
  name: 'kubernetes',
  type: 'kubernetes',
  ...(kubernetes ? { kubernetes } : {}),
});
const gcp = (patch: Obj = {}): Obj => ({
  name: 'gcp-main',
  type: 'gcp',
  gcp: { project: 'my-crawl-project', ...patch },
});
/** A kvm block; a patch value of undefined removes the key, as leaving it out of the YAML would. */
const kvmBlock = (patch: Obj = {}): Obj =>
  Object.fromEntries(
    Object.entries({
      sshKeyFile: '/key',
      knownHostsFile: '/kh',
      machineTypes: { small: { vcpus: 1, memoryMiB: 1024 } },
      hosts: [{ name: 'nas1', address: 'nas1.lan:22', user: 'virt', bridge: 'br0' }],
      ...patch,
    }).filter(([, v]) => v !== undefined),
  );
const kvm = (patch: Obj = {}): Obj => ({ name: 'kvm-home', type: 'kvm', kvm: kvmBlock(patch) });
const host = (patch: Obj = {}): Obj => ({
  name: 'nas1',
  address: 'nas1.lan:22',
  user: 'virt',
  bridge: 'br0',
  ...patch,
});
const local = (block?: Obj): Obj => ({ name: 'local', type: 'local', ...(block ? { local: block } : {}) });
const cfg = (...providers: Obj[]): Obj => ({ providers });

interface Case {
  name: string;
  config: unknown;
  /** [path, words the message contains]; empty = valid. Exactly these errors are expected. */
  errors?: [string, string][];
  warnings?: [string, string][];
}

const CASES: Case[] = [
  // Top level.
  { name: 'all four types', config: cfg(k8s(), gcp(), kvm(), local()) },
  { name: 'not an object', config: 'providers', errors: [['', 'must be an object']] },
  { name: 'providers missing', config: {}, errors: [['providers', 'is required']] },
  {
    name: 'unknown top-level key',
    config: { providers: [], extra: 1 },
    errors: [['extra', 'is not a known field']],
    warnings: [['providers', 'only External']],
  },
  { name: 'empty list warns', config: cfg(), warnings: [['providers', 'is empty']] },

  // Names.
  {
    name: 'empty name',
    config: cfg({ ...local(), name: '' }),
    errors: [['providers[0].name', 'must not be empty']],
  },
  {
    name: 'duplicate names',
    config: cfg(local(), { ...k8s(), name: 'local' }),
    errors: [['providers[1].name', 'duplicate provider name "local" (also providers[0])']],
  },
  {
    name: 'name not a Kubernetes object name warns',
    config: cfg({ ...local(), name: 'Local_Dev' }),
    warnings: [['providers[0].name', 'no ProviderHealth object']],
  },
  {
    name: 'name too long',
    config: cfg({ ...local(), name: 'a'.repeat(254) }),
    errors: [['providers[0].name', 'at most 253']],
  },
  {
    name: 'unknown type',
    config: cfg({ name: 'x', type: 'azure' }),
    errors: [['providers[0].type', 'must be one of kubernetes, gcp, kvm, local, aws']],
  },
  {
    name: 'unknown entry key',
    config: cfg({ ...local(), zone: 'a' }),
    errors: [['providers[0].zone', 'providers[0] (local): zone is not a known field']],
  },

  // Type blocks.
  { name: 'kubernetes without block', config: cfg(k8s()) },
  { name: 'local without block', config: cfg(local()) },
  {
    name: 'gcp without block',
    config: cfg({ name: 'g', type: 'gcp' }),
    errors: [['providers[0].gcp', 'is required for type gcp']],
  },
  {
    name: 'kvm without block',
    config: cfg({ name: 'k', type: 'kvm' }),
    errors: [['providers[0].kvm', 'is required for type kvm']],
  },
  {
    name: 'block of another type',
    config: cfg({ ...local(), kvm: kvmBlock() }),
    errors: [['providers[0].kvm', 'is not allowed for type local']],
  },

  // kubernetes.
  { name: 'kubernetes namespace ok', config: cfg(k8s({ namespace: 'egress-proxies' })) },
  {
    name: 'kubernetes namespace invalid',
    config: cfg(k8s({ namespace: 'Egress' })),
    errors: [['providers[0].kubernetes.namespace', 'DNS label']],
  },
  { name: 'maxFileDescriptors 4096', config: cfg(k8s({ maxFileDescriptors: 4096 })) },
  {
    name: 'maxFileDescriptors too small',
    config: cfg(k8s({ maxFileDescriptors: 10 })),
    errors: [['providers[0].kubernetes.maxFileDescriptors', 'at least 64']],
  },
  {
    name: 'maxFileDescriptors too large',
    config: cfg(k8s({ maxFileDescriptors: 2_000_000 })),
    errors: [['providers[0].kubernetes.maxFileDescriptors', 'at most 1048576']],
  },
  {
    name: 'empty image',
    config: cfg(k8s({ image: ' ' })),
    errors: [['providers[0].kubernetes.image', 'must not be empty']],
  },
  {
    name: 'imagePullPolicy invalid',
    config: cfg(k8s({ imagePullPolicy: 'Sometimes' })),
    errors: [['providers[0].kubernetes.imagePullPolicy', 'must be one of Always, IfNotPresent, Never']],
  },
  { name: 'zoneLabel ok', config: cfg(k8s({ zoneLabel: 'example.com/rack' })) },
  {
    name: 'zoneLabel invalid',
    config: cfg(k8s({ zoneLabel: 'bad label' })),
    errors: [['providers[0].kubernetes.zoneLabel', 'label key']],
  },
  {
    name: 'quantities ok',
    config: cfg(
      k8s({
        resourceProfiles: { small: { cpu: '100m', memory: '128Mi' }, big: { cpu: '1.5', memory: '1e9' } },
      }),
    ),
  },
  {
    name: 'quantity invalid',
    config: cfg(k8s({ resourceProfiles: { small: { cpu: '1 core', memory: '128MB' } } })),
    errors: [
      ['providers[0].kubernetes.resourceProfiles.small.cpu', 'Kubernetes quantity'],
      ['providers[0].kubernetes.resourceProfiles.small.memory', 'Kubernetes quantity'],
    ],
  },
  {
    name: 'unknown profile key',
    config: cfg(k8s({ resourceProfiles: { small: { gpu: '1' } } })),
    errors: [['providers[0].kubernetes.resourceProfiles.small.gpu', 'is not a known field']],
  },

  // gcp.
  {
    name: 'gcp project missing',
    config: cfg({ name: 'g', type: 'gcp', gcp: {} }),
    errors: [['providers[0].gcp.project', 'is required']],
  },
  { name: 'gcp domain-scoped project', config: cfg(gcp({ project: 'example.com:crawl-1' })) },
  {
    name: 'gcp project invalid',
    config: cfg(gcp({ project: 'My_Project' })),
    errors: [['providers[0].gcp.project', 'GCP project ID']],
  },
  {
    name: 'gcp project too short',
    config: cfg(gcp({ project: 'abc' })),
    errors: [['providers[0].gcp.project', 'GCP project ID']],
  },
  {
    name: 'gcp images ok',
    config: cfg(gcp({ images: { 'debian-13': 'projects/debian-cloud/global/images/family/debian-13' } })),
  },
  {
    name: 'gcp image empty',
    config: cfg(gcp({ images: { 'debian-13': '' } })),
    errors: [['providers[0].gcp.images["debian-13"]', 'must name a source image']],
  },
  {
    name: 'gcp firewall ok',
    config: cfg(
      gcp({ firewall: { sourceRanges: ['198.51.100.0/24', '2001:db8::/32'], targetTag: 'egress-proxy' } }),
    ),
  },
  {
    name: 'gcp firewall bad CIDR',
    config: cfg(gcp({ firewall: { sourceRanges: ['198.51.100.0/24', '10.0.0.0/33', 'example.com'] } })),
    errors: [
      ['providers[0].gcp.firewall.sourceRanges[1]', 'CIDR'],
      ['providers[0].gcp.firewall.sourceRanges[2]', 'CIDR'],
    ],
  },
  {
    name: 'gcp firewall without ranges',
    config: cfg(gcp({ firewall: { sourceRanges: [] } })),
    errors: [['providers[0].gcp.firewall.sourceRanges', 'at least one CIDR']],
  },
  {
    name: 'gcp firewall disabled without ranges',
    config: cfg(gcp({ firewall: { enabled: false, sourceRanges: [] } })),
  },
  {
    name: 'gcp firewall bad tag',
    config: cfg(gcp({ firewall: { sourceRanges: ['0.0.0.0/0'], targetTag: 'Proxy_Tag' } })),
    errors: [['providers[0].gcp.firewall.targetTag', 'network tag']],
  },
  {
    name: 'gcp diskSizeGb too small',
    config: cfg(gcp({ diskSizeGb: 5 })),
    errors: [['providers[0].gcp.diskSizeGb', 'at least 10']],
  },
  {
    name: 'gcp service account',
    config: cfg(gcp({ serviceAccountEmail: 'proxy' })),
    errors: [['providers[0].gcp.serviceAccountEmail', 'e-mail']],
  },
  { name: 'gcp apiEndpoint URL', config: cfg(gcp({ apiEndpoint: 'http://127.0.0.1:8085' })) },

  // kvm — the rules of the seed's config_kvm.go.
  { name: 'kvm minimal', config: cfg(kvm()) },
  {
    name: 'kvm host name with a slash',
    config: cfg(kvm({ hosts: [host(), host({ name: 'dc1/rack2' })] })),
    errors: [
      [
        'providers[0].kvm.hosts[1].name',
        'providers[0] (kvm-home): kvm.hosts[1].name "dc1/rack2" must be letters, digits, dots, dashes or underscores — it becomes part of the providerID hosts/<name>/domains/<vm>',
      ],
    ],
  },
  {
    name: 'kvm host name with dots and underscores',
    config: cfg(kvm({ hosts: [host({ name: 'nas_1.lan' })] })),
  },
  {
    name: 'kvm image key with a slash',
    config: cfg(kvm({ images: { '../etc/d': { url: 'https://x/y.qcow2' } } })),
    errors: [
      [
        'providers[0].kvm.images["../etc/d"]',
        'key must be letters, digits, dots, dashes or underscores — it becomes the cached volume name base-<key>.<format>',
      ],
    ],
  },
  {
    name: 'kvm image ok',
    config: cfg(
      kvm({
        images: {
          'debian-13': {
            url: 'https://cloud.debian.org/x.qcow2',
            sha256: 'a'.repeat(64),
            format: 'qcow2',
            firmware: 'bios',
          },
        },
      }),
    ),
  },
  {
    name: 'kvm image url not http',
    config: cfg(kvm({ images: { d: { url: 'ftp://x/y.qcow2' } } })),
    errors: [['providers[0].kvm.images.d.url', 'http(s) URL']],
  },
  {
    name: 'kvm image url without host',
    config: cfg(kvm({ images: { d: { url: 'https:///y.qcow2' } } })),
    errors: [['providers[0].kvm.images.d.url', 'http(s) URL']],
  },
  {
    name: 'kvm image sha256 short',
    config: cfg(kvm({ images: { d: { url: 'https://x/y', sha256: 'abc' } } })),
    errors: [['providers[0].kvm.images.d.sha256', '64 hex']],
  },
  {
    name: 'kvm image format',
    config: cfg(kvm({ images: { d: { url: 'https://x/y', format: 'vmdk' } } })),
    errors: [['providers[0].kvm.images.d.format', 'must be one of qcow2, raw (got "vmdk")']],
  },
  {
    name: 'kvm image firmware',
    config: cfg(kvm({ images: { d: { url: 'https://x/y', firmware: 'coreboot' } } })),
    errors: [['providers[0].kvm.images.d.firmware', 'must be one of uefi, bios']],
  },
  {
    name: 'kvm image direct kernel boot ok',
    config: cfg(
      kvm({
        images: {
          d: {
            url: 'https://x/y',
            firmware: 'bios',
            kernel: '/var/lib/images/vmlinuz',
            initrd: '/var/lib/images/initrd.img',
            cmdline: 'root=/dev/vda rw console=ttyS0',
          },
        },
      }),
    ),
  },
  {
    name: 'kvm image direct boot paths not absolute or empty',
    config: cfg(kvm({ images: { d: { url: 'https://x/y', kernel: 'vmlinuz', initrd: '' } } })),
    errors: [
      ['providers[0].kvm.images.d.kernel', '"vmlinuz" must be an absolute path on the kvm hosts'],
      ['providers[0].kvm.images.d.initrd', 'must not be empty (leave it out to boot from the disk)'],
    ],
  },
  {
    name: 'kvm image initrd and cmdline without kernel',
    config: cfg(kvm({ images: { d: { url: 'https://x/y', initrd: '/i', cmdline: 'quiet' } } })),
    errors: [
      ['providers[0].kvm.images.d.initrd', 'needs kernel: an initrd is only used with direct kernel boot'],
      [
        'providers[0].kvm.images.d.cmdline',
        'needs kernel: a command line is only used with direct kernel boot',
      ],
    ],
  },
  {
    name: 'kvm image control characters in kernel and cmdline',
    config: cfg(kvm({ images: { d: { url: 'https://x/y', kernel: '/k\n', cmdline: 'a\nb' } } })),
    errors: [
      ['providers[0].kvm.images.d.kernel', 'must not contain control characters'],
      ['providers[0].kvm.images.d.cmdline', 'must be one line without control characters'],
    ],
  },
  {
    name: 'kvm image kernel not a string',
    config: cfg(kvm({ images: { d: { url: 'https://x/y', kernel: 7 } } })),
    errors: [['providers[0].kvm.images.d.kernel', 'string']],
  },
  {
    name: 'kvm no machine types',
    config: cfg(kvm({ machineTypes: {} })),
    errors: [['providers[0].kvm.machineTypes', 'at least one machine type']],
  },
  {
    name: 'kvm machine type too small',
    config: cfg(kvm({ machineTypes: { tiny: { vcpus: 0, memoryMiB: 32 } } })),
    errors: [
      ['providers[0].kvm.machineTypes.tiny.vcpus', 'at least 1'],
      ['providers[0].kvm.machineTypes.tiny.memoryMiB', 'at least 64'],
    ],
  },
  {
    name: 'kvm no hosts',
    config: cfg(kvm({ hosts: [] })),
    errors: [['providers[0].kvm.hosts', 'at least one host']],
  },
  {
    name: 'kvm duplicate host',
    config: cfg(kvm({ hosts: [host(), host({ address: 'b:22' })] })),
    errors: [['providers[0].kvm.hosts[1].name', 'duplicate host name "nas1"']],
  },
  {
    name: 'kvm host missing address',
    config: cfg(kvm({ hosts: [{ name: 'nas1', user: 'virt', bridge: 'br0' }] })),
    errors: [['providers[0].kvm.hosts[0].address', 'is required']],
  },
  {
    name: 'kvm host missing user',
    config: cfg(kvm({ hosts: [{ name: 'nas1', address: 'a:22', bridge: 'br0' }] })),
    errors: [['providers[0].kvm.hosts[0].user', 'is required']],
  },
  {
    name: 'kvm host missing bridge',
    config: cfg(kvm({ hosts: [{ name: 'nas1', address: 'a:22', user: 'virt' }] })),
    errors: [['providers[0].kvm.hosts[0].bridge', 'is required']],
  },
  {
    name: 'kvm host empty name',
    config: cfg(kvm({ hosts: [host({ name: '' })] })),
    errors: [['providers[0].kvm.hosts[0].name', 'is required']],
  },
  {
    name: 'kvm address without port',
    config: cfg(kvm({ hosts: [host({ address: 'nas1.lan' })] })),
    errors: [['providers[0].kvm.hosts[0].address', 'host:port']],
  },
  {
    name: 'kvm address port out of range',
    config: cfg(kvm({ hosts: [host({ address: 'nas1.lan:70000' })] })),
    errors: [['providers[0].kvm.hosts[0].address', 'host:port']],
  },
  { name: 'kvm address IPv6', config: cfg(kvm({ hosts: [host({ address: '[2001:db8::1]:22' })] })) },
  {
    name: 'kvm socket relative',
    config: cfg(kvm({ hosts: [host({ socket: 'libvirt-sock' })] })),
    errors: [['providers[0].kvm.hosts[0].socket', 'absolute path']],
  },
  {
    name: 'kvm knownHostsFile missing',
    config: cfg(kvm({ knownHostsFile: undefined })),
    errors: [['providers[0].kvm.knownHostsFile', 'unless insecureIgnoreHostKey']],
  },
  {
    name: 'kvm insecureIgnoreHostKey without knownHostsFile warns',
    config: cfg(kvm({ knownHostsFile: undefined, insecureIgnoreHostKey: true })),
    warnings: [['providers[0].kvm.insecureIgnoreHostKey', 'not verified']],
  },
  {
    name: 'kvm sshKeyFile missing',
    config: cfg(kvm({ sshKeyFile: undefined })),
    errors: [['providers[0].kvm.sshKeyFile', 'is required']],
  },
  {
    name: 'kvm unknown key',
    config: cfg(kvm({ vendordata: 'x' })),
    errors: [['providers[0].kvm.vendordata', 'is not a known field; did you mean "vendorData"?']],
  },
  {
    name: 'kvm domainType',
    config: cfg(kvm({ domainType: 'xen' })),
    errors: [['providers[0].kvm.domainType', 'must be one of kvm, qemu']],
  },

  // local.
  {
    name: 'local full',
    config: cfg(
      local({
        bindAddress: '::1',
        advertiseAddress: 'proxies.example.com',
        portRange: { from: 1024, to: 65535 },
      }),
    ),
  },
  {
    name: 'local bindAddress not an IP',
    config: cfg(local({ bindAddress: 'localhost' })),
    errors: [['providers[0].local.bindAddress', 'IP address']],
  },
  {
    name: 'local advertiseAddress invalid',
    config: cfg(local({ advertiseAddress: 'not a host' })),
    errors: [['providers[0].local.advertiseAddress', 'host name or an IP']],
  },
  {
    name: 'local portRange reversed',
    config: cfg(local({ portRange: { from: 30000, to: 20000 } })),
    errors: [['providers[0].local.portRange', 'from (30000) must not be greater than to (20000)']],
  },
  {
    name: 'local portRange privileged',
    config: cfg(local({ portRange: { from: 80, to: 90 } })),
    errors: [
      ['providers[0].local.portRange.from', 'between 1024 and 65535'],
      ['providers[0].local.portRange.to', 'between 1024 and 65535'],
    ],
  },
  {
    name: 'local portRange above 65535',
    config: cfg(local({ portRange: { from: 20000, to: 70000 } })),
    errors: [['providers[0].local.portRange.to', 'at most 65535']],
  },
  { name: 'local single port', config: cfg(local({ portRange: { from: 20000, to: 20000 } })) },
  { name: 'local egressAddresses list', config: cfg(local({ egressAddresses: ['127.0.0.2', '::1'] })) },
  {
    name: 'local egressAddresses blocks',
    config: cfg(local({ egressAddresses: { cidr: '203.0.113.8/29', count: 6 } }), {
      ...local({ egressAddresses: { cidr: '2001:db8:7::/64', count: 65536 } }),
      name: 'v6',
    }),
  },
  {
    name: 'local egressAddresses list problems',
    config: cfg(local({ egressAddresses: ['127.0.0.2', 'eth0', '0.0.0.0', '127.0.0.02', '::1', '0:0::1'] })),
    errors: [
      ['providers[0].local.egressAddresses[1]', '"eth0" must be an IP address'],
      ['providers[0].local.egressAddresses[2]', 'unspecified address'],
      ['providers[0].local.egressAddresses[3]', '"127.0.0.02" must be an IP address'],
      ['providers[0].local.egressAddresses[5]', '"0:0::1" is listed twice (also [4])'],
    ],
  },
  {
    name: 'local egressAddresses empty',
    config: cfg(local({ egressAddresses: [] })),
    errors: [['providers[0].local.egressAddresses', 'names no address']],
  },
  {
    name: 'local egressAddresses count beyond the block',
    config: cfg(local({ egressAddresses: { cidr: '203.0.113.8/29', count: 7 } })),
    errors: [
      ['providers[0].local.egressAddresses.count', '7 is more than the 6 usable addresses of 203.0.113.8/29'],
    ],
  },
  {
    name: 'local egressAddresses bad block',
    config: cfg(local({ egressAddresses: { cidr: '203.0.113.9/29', count: 1 } })),
    errors: [['providers[0].local.egressAddresses.cidr', 'host bits set']],
  },
  {
    name: 'local egressAddresses count zero',
    config: cfg(local({ egressAddresses: { cidr: '203.0.113.8/29', count: 0 } })),
    errors: [['providers[0].local.egressAddresses.count', '0 must be at least 1']],
  },
  // Egress policy: the same block on every provider type.
  {
    name: 'egress policy on every type',
    config: cfg(
      k8s({ egressPolicy: { allowCIDRs: ['10.20.0.0/16'], connectPorts: [443, 8443] } }),
      gcp({ egressPolicy: { denyCIDRs: ['203.0.113.0/24', '2001:db8::/32'] } }),
      kvm({ egressPolicy: { allowCIDRs: ['192.168.10.0/24'] } }),
      local({ egressPolicy: { allowCIDRs: ['127.0.0.1/32', '::1/128'], connectPorts: [8443] } }),
    ),
  },
  {
    name: 'egress policy: a CIDR that is no CIDR, lacks a prefix, has host bits or a long prefix',
    config: cfg(
      local({
        egressPolicy: { allowCIDRs: ['localhost', '127.0.0.1'], denyCIDRs: ['10.0.0.1/8', '::1/129'] },
      }),
    ),
    errors: [
      ['providers[0].local.egressPolicy.allowCIDRs[0]', '"localhost" must be a CIDR range'],
      ['providers[0].local.egressPolicy.allowCIDRs[1]', 'needs a prefix length, e.g. 127.0.0.1/32'],
      ['providers[0].local.egressPolicy.denyCIDRs[0]', 'host bits set; the range it names is 10.0.0.0/8'],
      ['providers[0].local.egressPolicy.denyCIDRs[1]', 'prefix length "129"; it must be 0-128 for IPv6'],
    ],
  },
  {
    name: 'egress policy: ports out of range',
    config: cfg(gcp({ egressPolicy: { connectPorts: [443, 0, 70000] } })),
    errors: [
      ['providers[0].gcp.egressPolicy.connectPorts[1]', '0 is not a port (1-65535)'],
      ['providers[0].gcp.egressPolicy.connectPorts[2]', '70000 is not a port (1-65535)'],
    ],
  },
  {
    name: 'egress policy: a port that is not an integer, an unknown field',
    config: cfg(kvm({ egressPolicy: { connectPorts: [44.3], allowPorts: [22] } })),
    errors: [
      ['providers[0].kvm.egressPolicy.allowPorts', 'is not a known field'],
      ['providers[0].kvm.egressPolicy.connectPorts[0]', 'integer'],
    ],
  },
  {
    name: 'egress policy: no CONNECT port at all is allowed, with a warning',
    config: cfg(k8s({ egressPolicy: { connectPorts: [] } })),
    warnings: [['providers[0].kubernetes.egressPolicy.connectPorts', 'CONNECT is refused everywhere']],
  },
];

describe('validateProvidersConfig', () => {
  it.each(CASES)('$name', ({ config, errors = [], warnings = [] }) => {
    const result = validateProvidersConfig(config);
    const got = result.ok ? [] : result.errors;
    expect(got.map((e) => e.path)).toEqual(errors.map(([p]) => p));
    errors.forEach(([, words], i) => {
      expect(got[i]!.message).toContain(words);
    });
    expect(result.warnings.map((w) => w.path)).toEqual(warnings.map(([p]) => p));
    warnings.forEach(([, words], i) => {
      expect(result.warnings[i]!.message).toContain(words);
    });
    expect(result.ok).toBe(errors.length === 0);
  });

  it('labels every line with the entry index and name', () => {
    const result = validateProvidersConfig(cfg(local(), kvm({ hosts: [host({ address: 'x' })] })));
    expect(result.ok ? [] : result.errors.map((e) => e.message)).toEqual([
      'providers[1] (kvm-home): kvm.hosts[0].address "x" must be host:port, e.g. nas1.lan:22',
    ]);
  });

  it('reports problems of every entry at once', () => {
    const result = validateProvidersConfig(cfg(gcp({ project: 'X' }), local({ bindAddress: 'nope' })));
    expect(result.ok ? [] : result.errors.map((e) => e.path)).toEqual([
      'providers[0].gcp.project',
      'providers[1].local.bindAddress',
    ]);
  });

  it('names the nearest known field beside an unknown one, where one is near', () => {
    const config = {
      providers: [
        local({ portRnge: [20000, 20010] }),
        { ...kvm({ egressPolicy: { allowPort: [22] } }), Type: 'x' },
      ],
      gatway: {},
    };
    const result = validateProvidersConfig(config);
    expect(result.ok ? [] : result.errors.map((e) => e.message)).toEqual([
      'gatway is not a known field; did you mean "gateway"?',
      'providers[0] (local): local.portRnge is not a known field; did you mean "portRange"?',
      'providers[1] (kvm-home): Type is not a known field; did you mean "type"?',
      'providers[1] (kvm-home): kvm.egressPolicy.allowPort is not a known field',
    ]);
  });

  it('returns the config unchanged when valid', () => {
    const config = cfg(kvm(), local());
    const result = validateProvidersConfig(config);
    expect(result.ok && result.value).toBe(config);
  });
});
