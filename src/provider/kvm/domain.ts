/**
 * provider/kvm/domain — pure builders for the kvm provider: the providerID
 * `hosts/<host>/domains/<name>`, the libvirt domain XML of a proxy VM (with our metadata
 * element, parsed back here), the volume XML of the per-VM overlay, seed and cached base image,
 * and the domain-state → Instance-state mapping. No I/O; every value is XML-escaped.
 */
import type { InstanceState } from '../contract.ts';
import { permanent } from '../errors.ts';
import { DomainState } from './libvirt-protocol.ts';

/** Instance names, host names and image keys: they become domain and volume names. */
export const KVM_NAME_PATTERN = /^[A-Za-z0-9][A-Za-z0-9_.-]*$/;

/** XML namespace of our `<metadata>` element (libvirt keeps foreign-namespace metadata verbatim). */
export const METADATA_NAMESPACE = 'https://egress-proxies-operator.dev/kvm/v1';
const METADATA_PREFIX = 'epo';

export const GUEST_AGENT_CHANNEL = 'org.qemu.guest_agent.0';

export function xmlEscape(s: string): string {
  return s
    .replaceAll('&', '&amp;')
    .replaceAll('<', '&lt;')
    .replaceAll('>', '&gt;')
    .replaceAll("'", '&apos;')
    .replaceAll('"', '&quot;');
}

export function xmlUnescape(s: string): string {
  return s
    .replaceAll('&lt;', '<')
    .replaceAll('&gt;', '>')
    .replaceAll('&apos;', "'")
    .replaceAll('&quot;', '"')
    .replace(/&#(x[0-9a-fA-F]+|[0-9]+);/g, (_, n: string) =>
      String.fromCodePoint(n.startsWith('x') ? Number.parseInt(n.slice(1), 16) : Number(n)),
    )
    .replaceAll('&amp;', '&');
}

// ---- providerID -------------------------------------------------------------------------------

export interface DomainID {
  host: string;
  name: string;
}

export function providerIDOf(id: DomainID): string {
  return `hosts/${id.host}/domains/${id.name}`;
}

/** Strict parse: exactly `hosts/<host>/domains/<name>` with valid names, else Permanent. */
export function parseProviderID(providerID: string, provider: string): DomainID {
  const parts = providerID.split('/');
  const [hosts, host, domains, name] = parts;
  if (
    parts.length !== 4 ||
    hosts !== 'hosts' ||
    domains !== 'domains' ||
    host === undefined ||
    name === undefined ||
    !KVM_NAME_PATTERN.test(host) ||
    !KVM_NAME_PATTERN.test(name)
  ) {
    throw permanent(
      `${provider}: malformed kvm providerID ${JSON.stringify(providerID)} (want hosts/<host>/domains/<name>)`,
      { provider, op: 'parseProviderID' },
    );
  }
  return { host, name };
}

// ---- volume names and XML ---------------------------------------------------------------------

export const overlayVolumeName = (name: string) => `${name}.qcow2`;
export const seedVolumeName = (name: string) => `${name}-seed.iso`;
/**
 * A cached base image: content-addressed, so a changed image is a new volume and the bytes
 * under a running VM's overlay never change. `version` is `sha256-<16 hex of the checksum>`, or
 * `url-<16 hex of the URL's hash>` without a checksum; an image given as a bare URL is keyed by
 * that hash already and has no version part.
 */
export const baseVolumeName = (key: string, format: string, version?: string) =>
  version ? `base-${key}-${version}.${format}` : `base-${key}.${format}`;

/** Every base volume name image `key` can have had: versioned ones and the older unversioned one. */
export function baseVolumesOf(key: string): RegExp {
  const k = key.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
  return new RegExp(`^base-${k}(-(sha256|url)-[0-9a-f]{16})?\\.(qcow2|raw)$`);
}
export const markerVolumeName = (baseVolume: string) => `${baseVolume}.sha256`;

/** The backing file a volume's XML names (an overlay's base image), if any. */
export function backingPathOf(volumeXml: string): string | undefined {
  const m = /<backingStore>[\s\S]*?<path>([^<]*)<\/path>/.exec(volumeXml);
  return m?.[1] === undefined ? undefined : xmlUnescape(m[1].trim());
}

/** A plain file volume of `bytes` bytes, filled by an upload afterwards (seed ISO, base image, marker). */
export function rawVolumeXml(name: string, bytes: number): string {
  return `<volume>
  <name>${xmlEscape(name)}</name>
  <capacity unit='bytes'>${bytes}</capacity>
  <target><format type='raw'/></target>
</volume>`;
}

/** The per-VM copy-on-write disk on top of the cached base image. */
export function overlayVolumeXml(opts: {
  name: string;
  capacityGb: number;
  backingPath: string;
  backingFormat: string;
}): string {
  return `<volume>
  <name>${xmlEscape(opts.name)}</name>
  <capacity unit='GiB'>${opts.capacityGb}</capacity>
  <target><format type='qcow2'/></target>
  <backingStore>
    <path>${xmlEscape(opts.backingPath)}</path>
    <format type='${xmlEscape(opts.backingFormat)}'/>
  </backingStore>
</volume>`;
}

// ---- metadata ---------------------------------------------------------------------------------

export interface DomainMetadata {
  managed: boolean;
  uid?: string;
  namespace?: string;
  proxyName?: string;
  /** The installation that created the domain; absent on domains created before 0.3. */
  installation?: string;
  createdAt?: Date;
}

export interface MetadataFields {
  uid: string;
  namespace: string;
  proxyName: string;
  installation?: string;
  createdAt: Date;
}

export function metadataXml(m: MetadataFields): string {
  const p = METADATA_PREFIX;
  const el = (k: string, v: string) => `<${p}:${k}>${xmlEscape(v)}</${p}:${k}>`;
  const installation = m.installation ? el('installation', m.installation) : '';
  return `<${p}:proxy xmlns:${p}='${METADATA_NAMESPACE}'>${el('managed', 'true')}${el('uid', m.uid)}${el(
    'namespace',
    m.namespace,
  )}${el('proxyName', m.proxyName)}${installation}${el('createdAt', m.createdAt.toISOString())}</${p}:proxy>`;
}

const escapeRe = (s: string) => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');

/**
 * Our metadata element in a domain's XML (as libvirt returns it: it may re-quote the namespace
 * attribute and keeps the prefix). `managed: false` when the element is absent.
 */
export function parseMetadata(domainXml: string): DomainMetadata {
  const meta = /<metadata>([\s\S]*?)<\/metadata>/.exec(domainXml)?.[1];
  if (meta === undefined) return { managed: false };
  const ns = escapeRe(METADATA_NAMESPACE);
  const open = new RegExp(`<([A-Za-z_][\\w.-]*):proxy\\s+xmlns:\\1=(?:'${ns}'|"${ns}")\\s*>`).exec(meta);
  if (!open) return { managed: false };
  const prefix = escapeRe(open[1] ?? '');
  const rest = meta.slice(open.index + open[0].length);
  const end = rest.indexOf(`</${open[1]}:proxy>`);
  const body = end < 0 ? rest : rest.slice(0, end);
  const field = (k: string): string | undefined => {
    const m = new RegExp(`<${prefix}:${k}>([^<]*)</${prefix}:${k}>`).exec(body);
    return m?.[1] === undefined ? undefined : xmlUnescape(m[1]);
  };
  const out: DomainMetadata = { managed: field('managed') === 'true' };
  const uid = field('uid');
  const namespace = field('namespace');
  const proxyName = field('proxyName');
  const installation = field('installation');
  const created = field('createdAt');
  if (uid) out.uid = uid;
  if (namespace) out.namespace = namespace;
  if (proxyName) out.proxyName = proxyName;
  if (installation) out.installation = installation;
  if (created) {
    const d = new Date(created);
    if (!Number.isNaN(d.getTime())) out.createdAt = d;
  }
  return out;
}

// ---- domain XML -------------------------------------------------------------------------------

/**
 * Direct kernel boot: QEMU loads the kernel and initrd from files on the host and the disk needs
 * no bootloader (custom kernels, or images built without one).
 */
export interface DirectBoot {
  /** Absolute path on the host. */
  kernel: string;
  initrd?: string;
  cmdline?: string;
}

export interface DomainSpec {
  name: string;
  domainType: 'kvm' | 'qemu';
  firmware: 'uefi' | 'bios';
  vcpus: number;
  memoryMiB: number;
  pool: string;
  overlayVolume: string;
  seedVolume: string;
  bridge: string;
  directBoot?: DirectBoot;
  /** Replaces the bridge NIC; tests only (a machine without a bridge). */
  interfaceXml?: string;
  metadata: MetadataFields;
}

export function bridgeInterfaceXml(bridge: string): string {
  return `<interface type='bridge'>
      <source bridge='${xmlEscape(bridge)}'/>
      <model type='virtio'/>
    </interface>`;
}

/** The `<os>` lines after `<type>`: the kernel to load directly, else boot from the disk. */
function bootXml(boot: DirectBoot | undefined): string {
  if (!boot) return `\n    <boot dev='hd'/>`;
  const line = (tag: string, v: string | undefined) =>
    v === undefined ? '' : `\n    <${tag}>${xmlEscape(v)}</${tag}>`;
  return line('kernel', boot.kernel) + line('initrd', boot.initrd) + line('cmdline', boot.cmdline);
}

export function domainXml(s: DomainSpec): string {
  const pool = xmlEscape(s.pool);
  const boot = bootXml(s.directBoot);
  // UEFI through libvirt's firmware autoselection, secure boot off: cloud images boot unsigned
  // shims on some distributions, and we need no enrolled keys.
  const os =
    s.firmware === 'uefi'
      ? `<os firmware='efi'>
    <type arch='x86_64' machine='q35'>hvm</type>
    <firmware>
      <feature enabled='no' name='secure-boot'/>
    </firmware>${boot}
  </os>`
      : `<os>
    <type arch='x86_64' machine='q35'>hvm</type>${boot}
  </os>`;
  // Under TCG there is no host CPU to pass through.
  const cpu = s.domainType === 'kvm' ? `\n  <cpu mode='host-passthrough'/>` : '';
  const nic = s.interfaceXml ?? bridgeInterfaceXml(s.bridge);
  return `<domain type='${s.domainType}'>
  <name>${xmlEscape(s.name)}</name>
  <metadata>
    ${metadataXml(s.metadata)}
  </metadata>
  <memory unit='MiB'>${s.memoryMiB}</memory>
  <vcpu>${s.vcpus}</vcpu>
  ${os}
  <features><acpi/><apic/></features>${cpu}
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>restart</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <disk type='volume' device='disk'>
      <driver name='qemu' type='qcow2' discard='unmap'/>
      <source pool='${pool}' volume='${xmlEscape(s.overlayVolume)}'/>
      <target dev='vda' bus='virtio'/>
    </disk>
    <disk type='volume' device='cdrom'>
      <driver name='qemu' type='raw'/>
      <source pool='${pool}' volume='${xmlEscape(s.seedVolume)}'/>
      <target dev='sda' bus='sata'/>
      <readonly/>
    </disk>
    ${nic}
    <serial type='pty'><target port='0'/></serial>
    <console type='pty'><target type='serial' port='0'/></console>
    <channel type='unix'><target type='virtio' name='${GUEST_AGENT_CHANNEL}'/></channel>
    <rng model='virtio'><backend model='random'>/dev/urandom</backend></rng>
    <memballoon model='none'/>
  </devices>
</domain>`;
}

// ---- state and addresses ------------------------------------------------------------------------

/** libvirt's domain state as ours; running without a known address is still Pending. */
export function instanceState(state: number, hasAddress: boolean): InstanceState {
  switch (state) {
    case DomainState.RUNNING:
    case DomainState.BLOCKED:
      return hasAddress ? 'Running' : 'Pending';
    case DomainState.NOSTATE:
      return 'Pending';
    case DomainState.SHUTDOWN:
      return 'Stopping';
    case DomainState.PAUSED:
    case DomainState.SHUTOFF:
    case DomainState.PMSUSPENDED:
      return 'Stopped';
    case DomainState.CRASHED:
      return 'Terminated';
    default:
      return 'Unknown';
  }
}

/** Whether an address can reach the proxy from outside the VM (not loopback or link-local). */
export function usableAddress(addr: string): boolean {
  const a = addr.toLowerCase();
  if (a.startsWith('127.') || a.startsWith('169.254.') || a === '0.0.0.0') return false;
  if (a === '::1' || a === '::' || /^fe[89ab][0-9a-f]:/.test(a)) return false;
  return true;
}

/** The first usable IPv4 address of the interfaces, else the first usable IPv6 one. */
export function pickAddress(ifaces: ReadonlyArray<{ addrs: ReadonlyArray<{ type: number; addr: string }> }>) {
  const all = ifaces.flatMap((i) => i.addrs).filter((a) => usableAddress(a.addr));
  return (all.find((a) => a.type === 0) ?? all[0])?.addr;
}
