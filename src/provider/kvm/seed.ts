/**
 * provider/kvm/seed — the content of a VM's cloud-init NoCloud seed (`user-data`, `meta-data`,
 * optional `vendor-data`) and its `cidata` ISO. The user's document is carried byte for byte and
 * never parsed, logged or put into an error message.
 */

import { Buffer } from 'node:buffer';
import { createHash } from 'node:crypto';
import { ProviderError } from '../errors.ts';
import { buildIso, DEFAULT_ISO_TIMESTAMP } from './iso9660.ts';

/** The label cloud-init's NoCloud datasource looks for. */
export const SEED_VOLUME_ID = 'cidata';
export const USER_DATA = 'user-data';
export const META_DATA = 'meta-data';
export const VENDOR_DATA = 'vendor-data';

export interface SeedOptions {
  /** cloud-init instance-id; a new id makes cloud-init treat the VM as a new instance. */
  instanceId: string;
  /** local-hostname (RFC 1123). */
  hostname: string;
  /** The Proxy's cloud-init, written unchanged (any format cloud-init accepts). */
  userData: string | Uint8Array;
  /** Extra vendor-data from the provider config (`kvm.vendorData`); empty counts as absent. */
  vendorData?: string;
  /** Ship the vendor-data script that installs qemu-guest-agent. Default true. */
  installGuestAgent?: boolean;
  /** Dates inside the ISO; fixed by default so the same seed always has the same bytes. */
  timestamp?: Date;
}

export interface SeedFile {
  name: string;
  data: Buffer;
}

export interface Seed {
  files: SeedFile[];
  iso: Buffer;
}

export class SeedInputError extends ProviderError {
  readonly field: string;
  constructor(field: string, message: string) {
    super('Permanent', `${field}: ${message}`, { op: 'buildSeed', provider: 'kvm' });
    this.name = 'SeedInputError';
    this.field = field;
  }
}

/**
 * Installs and starts qemu-guest-agent, which the provider asks for the VM's address. A vendor
 * script rather than cloud-config, because cloud-init drops vendor cloud-config keys the user's
 * document also defines (e.g. `packages:`), while vendor scripts run on their own (after the
 * user's packages, before the user's runcmd). Safe to run again.
 */
export const GUEST_AGENT_SCRIPT = `#!/bin/sh
# Written by egress-proxies-operator: installs and starts qemu-guest-agent so the
# kvm provider can read this VM's address. Safe to run more than once.
set -u
log() { echo "install-qemu-guest-agent: $*"; }
retry() {
  n=0
  until "$@"; do
    n=$((n + 1))
    if [ "$n" -ge 5 ]; then return 1; fi
    log "retrying in 10s: $*"
    sleep 10
  done
}
if command -v qemu-ga >/dev/null 2>&1; then
  log "qemu-guest-agent already installed"
elif command -v apt-get >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  retry apt-get -o DPkg::Lock::Timeout=120 update -q || log "apt-get update failed; trying the install anyway"
  retry apt-get -o DPkg::Lock::Timeout=120 install -y -q qemu-guest-agent || { log "apt-get install failed"; exit 1; }
elif command -v dnf >/dev/null 2>&1; then
  retry dnf install -y qemu-guest-agent || { log "dnf install failed"; exit 1; }
elif command -v yum >/dev/null 2>&1; then
  retry yum install -y qemu-guest-agent || { log "yum install failed"; exit 1; }
elif command -v zypper >/dev/null 2>&1; then
  retry zypper --non-interactive install qemu-guest-agent || { log "zypper install failed"; exit 1; }
elif command -v apk >/dev/null 2>&1; then
  retry apk add --no-cache qemu-guest-agent || { log "apk add failed"; exit 1; }
else
  log "no supported package manager (apt-get, dnf, yum, zypper, apk); bake qemu-guest-agent into the image"
  exit 1
fi
if command -v systemctl >/dev/null 2>&1; then
  # Debian's unit is static (started by udev), so enable may refuse; start is what matters.
  systemctl enable qemu-guest-agent >/dev/null 2>&1 || true
  systemctl start qemu-guest-agent || { log "could not start qemu-guest-agent"; exit 1; }
elif command -v rc-service >/dev/null 2>&1; then
  rc-update add qemu-guest-agent default >/dev/null 2>&1 || true
  rc-service qemu-guest-agent start || { log "could not start qemu-guest-agent"; exit 1; }
else
  log "no systemctl or rc-service; qemu-guest-agent installed but not started"
  exit 1
fi
log "qemu-guest-agent running"
`;

const GUEST_AGENT_SCRIPT_NAME = 'install-qemu-guest-agent.sh';
const CONFIG_PART_NAME = 'vendor-data.txt';

const HOSTNAME_LABEL_RE = /^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$/;
const INSTANCE_ID_RE = /^[A-Za-z0-9][A-Za-z0-9_.:-]*$/;
// PyYAML (YAML 1.1) would read these plain scalars as booleans or null.
const YAML11_WORDS = new Set(['y', 'n', 'yes', 'no', 'true', 'false', 'on', 'off', 'null']);

/** A YAML scalar that cloud-init (PyYAML, YAML 1.1) reads back as exactly this string. */
export function yamlString(value: string): string {
  const plain = /^[A-Za-z][A-Za-z0-9_.-]*$/.test(value) && !YAML11_WORDS.has(value.toLowerCase());
  return plain ? value : JSON.stringify(value);
}

function validateHostname(hostname: unknown): string {
  if (typeof hostname !== 'string' || hostname.length === 0) {
    throw new SeedInputError('hostname', 'must be a non-empty string');
  }
  if (hostname.length > 253)
    throw new SeedInputError('hostname', `is ${hostname.length} characters, the limit is 253`);
  const bad = hostname.split('.').find((label) => !HOSTNAME_LABEL_RE.test(label));
  if (bad !== undefined) {
    throw new SeedInputError(
      'hostname',
      `${JSON.stringify(hostname)} is not an RFC 1123 host name (label ${JSON.stringify(bad)})`,
    );
  }
  return hostname;
}

function validateInstanceId(instanceId: unknown): string {
  if (typeof instanceId !== 'string' || instanceId.length === 0) {
    throw new SeedInputError('instanceId', 'must be a non-empty string');
  }
  if (instanceId.length > 255) {
    throw new SeedInputError('instanceId', `is ${instanceId.length} characters, the limit is 255`);
  }
  if (!INSTANCE_ID_RE.test(instanceId)) {
    throw new SeedInputError('instanceId', `${JSON.stringify(instanceId)} may only use A-Z a-z 0-9 _ . : -`);
  }
  return instanceId;
}

/** `meta-data` as NoCloud reads it. */
export function renderMetaData(instanceId: string, hostname: string): string {
  const id = validateInstanceId(instanceId);
  const host = validateHostname(hostname);
  return `instance-id: ${yamlString(id)}\nlocal-hostname: ${yamlString(host)}\n`;
}

function mimePart(contentType: string, filename: string, body: string): string {
  const encoded = Buffer.from(body, 'utf8')
    .toString('base64')
    .replace(/.{1,76}/g, '$&\n');
  return [
    `Content-Type: ${contentType}; charset="utf-8"`,
    'MIME-Version: 1.0',
    'Content-Transfer-Encoding: base64',
    `Content-Disposition: attachment; filename="${filename}"`,
    '',
    encoded,
  ].join('\n');
}

/**
 * A multipart/mixed vendor-data in the shape `cloud-init devel make-mime` produces. Parts are
 * base64, so no content can collide with the boundary. The configured document is always
 * declared text/plain: cloud-init re-detects that type from the content's first line (any case,
 * leading blanks, longest prefix first), while a declared type is taken as is — a prefix test
 * here would call `#cloud-config-archive` and `#cloud-config-jsonp` documents cloud-config.
 */
export function renderMultipartVendorData(vendorData: string, script: string): string {
  const parts = [
    mimePart('text/plain', CONFIG_PART_NAME, vendorData),
    mimePart('text/x-shellscript', GUEST_AGENT_SCRIPT_NAME, script),
  ];
  const digest = createHash('sha256')
    .update(vendorData)
    .update('\0')
    .update(script)
    .digest('hex')
    .slice(0, 24);
  const boundary = `===============${digest}==`;
  return [
    `Content-Type: multipart/mixed; boundary="${boundary}"`,
    'MIME-Version: 1.0',
    '',
    ...parts.map((p) => `--${boundary}\n${p}`),
    `--${boundary}--`,
    '',
  ].join('\n');
}

/** vendor-data for the given options, or undefined when there is none to ship. */
export function renderVendorData(
  vendorData: string | undefined,
  installGuestAgent: boolean,
): string | undefined {
  const extra = vendorData === undefined || vendorData === '' ? undefined : vendorData;
  if (!installGuestAgent) return extra;
  if (extra === undefined) return GUEST_AGENT_SCRIPT;
  return renderMultipartVendorData(extra, GUEST_AGENT_SCRIPT);
}

/** The seed files and their `cidata` ISO. Same options, same bytes. */
export function buildSeed(options: SeedOptions): Seed {
  const { userData, vendorData } = options;
  if (typeof userData !== 'string' && !(userData instanceof Uint8Array)) {
    throw new SeedInputError('userData', 'must be a string or a Buffer');
  }
  if (vendorData !== undefined && typeof vendorData !== 'string') {
    throw new SeedInputError('vendorData', 'must be a string');
  }
  const installGuestAgent = options.installGuestAgent ?? true;
  if (typeof installGuestAgent !== 'boolean')
    throw new SeedInputError('installGuestAgent', 'must be a boolean');

  const files: SeedFile[] = [
    {
      name: USER_DATA,
      // A copy, so a caller reusing its buffer cannot change a seed already built.
      data: typeof userData === 'string' ? Buffer.from(userData, 'utf8') : Buffer.from(userData),
    },
    { name: META_DATA, data: Buffer.from(renderMetaData(options.instanceId, options.hostname), 'utf8') },
  ];
  const vendor = renderVendorData(vendorData, installGuestAgent);
  if (vendor !== undefined) files.push({ name: VENDOR_DATA, data: Buffer.from(vendor, 'utf8') });
  const iso = buildIso({
    volumeId: SEED_VOLUME_ID,
    files,
    timestamp: options.timestamp ?? DEFAULT_ISO_TIMESTAMP,
  });
  return { files, iso };
}
