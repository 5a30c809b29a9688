/**
 * config/defaults — the value every optional providers-config field takes when it is left out,
 * in one place so the providers, the validator and docs/configuration.md agree.
 */
import type {
  KubernetesProviderConfig,
  KvmHost,
  KvmImage,
  KvmProviderConfig,
  LocalProviderConfig,
} from './schema.ts';

export const KUBERNETES_DEFAULTS = {
  image: 'ubuntu/squid',
  imagePullPolicy: 'IfNotPresent',
  maxFileDescriptors: 4096,
  zoneLabel: 'topology.kubernetes.io/zone',
} as const;

export const KVM_DEFAULTS = {
  insecureIgnoreHostKey: false,
  diskSizeGb: 10,
  installGuestAgent: true,
  domainType: 'kvm',
} as const;
export const KVM_IMAGE_DEFAULTS = { format: 'qcow2', firmware: 'uefi' } as const;
export const KVM_HOST_DEFAULTS = { socket: '/var/run/libvirt/libvirt-sock', pool: 'default' } as const;

export const LOCAL_DEFAULTS = {
  bindAddress: '127.0.0.1',
  portRange: { from: 20000, to: 20999 },
} as const;
/** Ports below this need privileges the operator does not have (it runs as non-root). */
export const LOCAL_MIN_PORT = 1024;

export const AWS_DEFAULTS = {
  instanceType: 't3.micro',
  /** Ubuntu 24.04 (runs cloud-init; Debian's Squid package and layout), by Canonical's public parameter. */
  image: 'ssm:/aws/service/canonical/ubuntu/server/24.04/stable/current/amd64/hvm/ebs-gp3/ami-id',
  publicIPv4: true,
  ipv6: false,
  market: 'on-demand',
} as const;

export const GCP_DEFAULTS = {
  network: 'default',
  diskSizeGb: 10,
  spot: false,
  firewallEnabled: true,
  firewallTargetTag: 'egress-proxy',
} as const;

/** The kubernetes block with every default filled in (`namespace` stays the operator's own when unset). */
export function kubernetesWithDefaults(c: KubernetesProviderConfig = {}) {
  return {
    ...c,
    image: c.image ?? KUBERNETES_DEFAULTS.image,
    imagePullPolicy: c.imagePullPolicy ?? KUBERNETES_DEFAULTS.imagePullPolicy,
    maxFileDescriptors: c.maxFileDescriptors ?? KUBERNETES_DEFAULTS.maxFileDescriptors,
    zoneLabel: c.zoneLabel ?? KUBERNETES_DEFAULTS.zoneLabel,
    resourceProfiles: c.resourceProfiles ?? {},
  };
}

export function localWithDefaults(c: LocalProviderConfig = {}) {
  const bindAddress = c.bindAddress ?? LOCAL_DEFAULTS.bindAddress;
  return {
    bindAddress,
    advertiseAddress: c.advertiseAddress ?? bindAddress,
    portRange: c.portRange ?? { ...LOCAL_DEFAULTS.portRange },
  };
}

export function kvmImageWithDefaults(i: KvmImage) {
  return {
    ...i,
    format: i.format ?? KVM_IMAGE_DEFAULTS.format,
    firmware: i.firmware ?? KVM_IMAGE_DEFAULTS.firmware,
  };
}

export function kvmHostWithDefaults(h: KvmHost) {
  return { ...h, socket: h.socket ?? KVM_HOST_DEFAULTS.socket, pool: h.pool ?? KVM_HOST_DEFAULTS.pool };
}

export function kvmWithDefaults(c: KvmProviderConfig) {
  return {
    ...c,
    insecureIgnoreHostKey: c.insecureIgnoreHostKey ?? KVM_DEFAULTS.insecureIgnoreHostKey,
    diskSizeGb: c.diskSizeGb ?? KVM_DEFAULTS.diskSizeGb,
    installGuestAgent: c.installGuestAgent ?? KVM_DEFAULTS.installGuestAgent,
    domainType: c.domainType ?? KVM_DEFAULTS.domainType,
    images: Object.fromEntries(Object.entries(c.images ?? {}).map(([k, v]) => [k, kvmImageWithDefaults(v)])),
    hosts: c.hosts.map(kvmHostWithDefaults),
  };
}
