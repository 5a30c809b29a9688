/**
 * config/validate — checks a parsed providers config before anything is built from it: the
 * shape (unknown keys are errors everywhere), then the rules a schema cannot say. Every problem
 * becomes one line naming the entry and the field path, e.g.
 * `providers[0] (kvm-home): kvm.hosts[1].name "dc1/rack2" must be …`, so a bad config fails
 * fast with all its problems at once and nothing starts half-configured.
 */
import { isIP } from 'node:net';
import { Compile } from 'typebox/compile';
import { childPath, type FieldError, schemaErrors } from '../api/schema-errors.ts';
import { isHttpUrl } from '../api/url.ts';
import { isDnsLabel, isDnsSubdomain } from '../api/validate.ts';
import { LOCAL_MIN_PORT } from './defaults.ts';
import { cidrProblem, type EgressPolicyConfig } from './egress.ts';
import { egressAddressProblems } from './egress-addresses.ts';
import { ruleProblems } from './gateway-rules.ts';
import {
  type AwsProviderConfig,
  type GatewayConfig,
  type GcpProviderConfig,
  type KubernetesProviderConfig,
  type KvmImage,
  type KvmProviderConfig,
  type LocalProviderConfig,
  PROVIDER_TYPES,
  type ProviderEntry,
  type ProvidersConfig,
  ProvidersConfigSchema,
} from './schema.ts';

/** One problem. `path` is the bare field path; `message` is the full line shown to users. */
export interface ConfigIssue {
  path: string;
  message: string;
}

export type ProvidersConfigResult =
  | { ok: true; value: ProvidersConfig; warnings: ConfigIssue[] }
  | { ok: false; errors: ConfigIssue[]; warnings: ConfigIssue[] };

const validator = Compile(ProvidersConfigSchema);

/** Names pasted into provider IDs and file names elsewhere (see the KVM messages below). */
export const KVM_IDENTIFIER = /^[A-Za-z0-9][A-Za-z0-9_.-]*$/;
const SHA256_HEX = /^[0-9a-fA-F]{64}$/;
const GCP_PROJECT_ID = /^([a-z0-9][a-z0-9.-]*[a-z0-9]:)?[a-z][a-z0-9-]{4,28}[a-z0-9]$/;
const GCP_NETWORK_TAG = /^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$/;
const QUANTITY = /^[+-]?(\d+(\.\d*)?|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?$/;
const HOSTNAME =
  /^(?=.{1,253}$)[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?)*\.?$/;
const LABEL_NAME = /^([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]$/;

/** `a.b.c/24` or `2001:db8::/32` with a prefix length that fits the address family. */
export function isCidr(s: string): boolean {
  const slash = s.indexOf('/');
  if (slash < 0) return false;
  const family = isIP(s.slice(0, slash));
  const bits = s.slice(slash + 1);
  if (family === 0 || !/^\d{1,3}$/.test(bits)) return false;
  return Number(bits) <= (family === 4 ? 32 : 128);
}

/** `host:port` or `[v6]:port` with a port in 1–65535. */
export function isHostPort(s: string): boolean {
  const m = /^(\[([0-9A-Fa-f:.]+)\]|([^:[\]\s]+)):(\d{1,5})$/.exec(s);
  if (!m) return false;
  const port = Number(m[4]);
  if (port < 1 || port > 65535) return false;
  return m[2] !== undefined ? isIP(m[2]) === 6 : isIP(m[3]!) === 4 || HOSTNAME.test(m[3]!);
}

/** Kubernetes label key: optional DNS-subdomain prefix, `/`, and a name of at most 63 characters. */
export function isLabelKey(s: string): boolean {
  const slash = s.lastIndexOf('/');
  const name = slash < 0 ? s : s.slice(slash + 1);
  const prefix = slash < 0 ? undefined : s.slice(0, slash);
  return LABEL_NAME.test(name) && (prefix === undefined || isDnsSubdomain(prefix));
}

export function isQuantity(s: string): boolean {
  return QUANTITY.test(s);
}

const q = (s: string) => JSON.stringify(s);

/** Collects issues for one entry, rendering the path relative to it after its label. */
class Issues {
  readonly errors: ConfigIssue[] = [];
  readonly warnings: ConfigIssue[] = [];
  private readonly base: string;
  private readonly label: string;
  constructor(base: string, label: string) {
    this.base = base;
    this.label = label;
  }
  private line(rel: string, text: string): ConfigIssue {
    const path = rel === '' ? this.base : childPathOf(this.base, rel);
    return { path, message: `${this.label}${rel === '' ? '' : `${rel} `}${text}` };
  }
  error(rel: string, text: string): void {
    this.errors.push(this.line(rel, text));
  }
  warn(rel: string, text: string): void {
    this.warnings.push(this.line(rel, text));
  }
}

function childPathOf(base: string, rel: string): string {
  if (base === '') return rel;
  return rel.startsWith('[') ? `${base}${rel}` : `${base}.${rel}`;
}

export function entryLabel(index: number, entry: unknown): string {
  const name = (entry as { name?: unknown } | undefined)?.name;
  return typeof name === 'string' && name !== ''
    ? `providers[${index}] (${name}): `
    : `providers[${index}]: `;
}

function nonEmpty(issues: Issues, rel: string, value: string | undefined): void {
  if (value !== undefined && value.trim() === '') issues.error(rel, 'must not be empty');
}

function checkKubernetes(c: KubernetesProviderConfig, x: Issues): void {
  if (c.namespace !== undefined && !isDnsLabel(c.namespace)) {
    x.error(
      'kubernetes.namespace',
      `${q(c.namespace)} must be a DNS label: lower-case letters, digits and "-", at most 63 characters`,
    );
  }
  nonEmpty(x, 'kubernetes.image', c.image);
  if (c.zoneLabel !== undefined && !isLabelKey(c.zoneLabel)) {
    x.error(
      'kubernetes.zoneLabel',
      `${q(c.zoneLabel)} must be a Kubernetes label key such as topology.kubernetes.io/zone`,
    );
  }
  for (const [name, profile] of Object.entries(c.resourceProfiles ?? {})) {
    const at = childPath('kubernetes.resourceProfiles', name);
    if (name.trim() === '') x.error(at, 'key must not be empty — placement.machineType names it');
    for (const field of ['cpu', 'memory'] as const) {
      const v = profile[field];
      if (v !== undefined && !isQuantity(v)) {
        x.error(
          `${at}.${field}`,
          `${q(v)} must be a Kubernetes quantity such as ${field === 'cpu' ? '500m or 1' : '256Mi or 1Gi'}`,
        );
      }
    }
  }
}

function checkGcp(c: GcpProviderConfig, x: Issues): void {
  if (!GCP_PROJECT_ID.test(c.project)) {
    x.error(
      'gcp.project',
      `${q(c.project)} must be a GCP project ID: 6 to 30 lower-case letters, digits or dashes, starting with a letter and not ending with a dash`,
    );
  }
  nonEmpty(x, 'gcp.credentialsFile', c.credentialsFile);
  nonEmpty(x, 'gcp.network', c.network);
  nonEmpty(x, 'gcp.subnetwork', c.subnetwork);
  if (c.serviceAccountEmail !== undefined && !/^[^@\s]+@[^@\s]+$/.test(c.serviceAccountEmail)) {
    x.error('gcp.serviceAccountEmail', `${q(c.serviceAccountEmail)} must be an e-mail address`);
  }
  for (const [key, image] of Object.entries(c.images ?? {})) {
    const at = childPath('gcp.images', key);
    if (key.trim() === '') x.error(at, 'key must not be empty — placement.image names it');
    if (image.trim() === '')
      x.error(at, 'must name a source image (an image URL or projects/<p>/global/images/<name>)');
  }
  if (c.firewall) {
    c.firewall.sourceRanges.forEach((r, i) => {
      if (!isCidr(r)) {
        x.error(`gcp.firewall.sourceRanges[${i}]`, `${q(r)} must be a CIDR range such as 203.0.113.0/24`);
      }
    });
    if (c.firewall.enabled !== false && c.firewall.sourceRanges.length === 0) {
      x.error(
        'gcp.firewall.sourceRanges',
        'must list at least one CIDR range while the firewall is enabled — the rule admits only these sources',
      );
    }
    if (c.firewall.targetTag !== undefined && !GCP_NETWORK_TAG.test(c.firewall.targetTag)) {
      x.error(
        'gcp.firewall.targetTag',
        `${q(c.firewall.targetTag)} must be a GCP network tag: lower-case letters, digits and dashes, starting with a letter, at most 63 characters`,
      );
    }
  }
  if (
    c.apiEndpoint !== undefined &&
    !isHttpUrl(c.apiEndpoint) &&
    !HOSTNAME.test(c.apiEndpoint.replace(/:\d+$/, ''))
  ) {
    x.error('gcp.apiEndpoint', 'must be a host name or an http(s) URL');
  }
}

const AWS_REGION = /^[a-z]{2}(-[a-z]+)+-\d+$/;
const AWS_ZONE = /^[a-z]{2}(-[a-z]+)+-\d+[a-z]$/;
const AWS_SUBNET = /^subnet-[0-9a-f]{8,17}$/;
const AWS_GROUP = /^sg-[0-9a-f]{8,17}$/;
const AWS_AMI = /^ami-[0-9a-f]{8,17}$/;
const AWS_SSM_PARAMETER = /^ssm:\/[A-Za-z0-9_.\-/]+$/;
const AWS_INSTANCE_TYPE = /^[a-z][a-z0-9-]*\.[a-z0-9]+$/;
const AWS_PRICE = /^\d+(\.\d+)?$/;

function checkAws(c: AwsProviderConfig, x: Issues): void {
  if (c.regions.length === 0) x.error('aws.regions', 'must list at least one region');
  const seenRegions = new Map<string, number>();
  c.regions.forEach((r, i) => {
    const at = `aws.regions[${i}]`;
    if (!AWS_REGION.test(r.name))
      x.error(`${at}.name`, `${q(r.name)} must be an AWS region such as eu-west-1`);
    const first = seenRegions.get(r.name);
    if (first !== undefined)
      x.error(`${at}.name`, `duplicate region ${q(r.name)} (also aws.regions[${first}])`);
    else seenRegions.set(r.name, i);
    if (r.subnets.length === 0)
      x.error(`${at}.subnets`, 'must list at least one subnet — instances are started in them');
    r.subnets.forEach((s, j) => {
      if (!AWS_SUBNET.test(s.id))
        x.error(`${at}.subnets[${j}].id`, `${q(s.id)} must be a subnet ID such as subnet-0123456789abcdef0`);
      if (!AWS_ZONE.test(s.zone) || !s.zone.startsWith(r.name)) {
        x.error(
          `${at}.subnets[${j}].zone`,
          `${q(s.zone)} must be an availability zone of ${r.name} such as ${r.name}a`,
        );
      }
    });
    (r.securityGroupIds ?? []).forEach((g, j) => {
      if (!AWS_GROUP.test(g))
        x.error(
          `${at}.securityGroupIds[${j}]`,
          `${q(g)} must be a security group ID such as sg-0123456789abcdef0`,
        );
    });
    if (c.securityGroup === undefined && (r.securityGroupIds ?? []).length === 0) {
      x.error(
        `${at}.securityGroupIds`,
        'must list at least one group unless aws.securityGroup is set — otherwise the VPC default group decides who reaches the proxies',
      );
    }
  });
  nonEmpty(x, 'aws.profile', c.profile);
  for (const [key, t] of Object.entries(c.instanceTypes ?? {})) {
    const at = childPath('aws.instanceTypes', key);
    if (key.trim() === '') x.error(at, 'key must not be empty — placement.machineType names it');
    if (!AWS_INSTANCE_TYPE.test(t)) x.error(at, `${q(t)} must be an EC2 instance type such as t3.micro`);
  }
  for (const [key, image] of Object.entries(c.images ?? {})) {
    const at = childPath('aws.images', key);
    if (key.trim() === '') x.error(at, 'key must not be empty — placement.image names it');
    if (!AWS_AMI.test(image) && !AWS_SSM_PARAMETER.test(image)) {
      x.error(
        at,
        `${q(image)} must be an AMI ID (ami-…) or ssm:<parameter>, e.g. ssm:/aws/service/canonical/ubuntu/server/24.04/stable/current/amd64/hvm/ebs-gp3/ami-id`,
      );
    }
  }
  if (c.securityGroup) {
    c.securityGroup.sourceRanges.forEach((r, i) => {
      if (!isCidr(r))
        x.error(
          `aws.securityGroup.sourceRanges[${i}]`,
          `${q(r)} must be a CIDR range such as 203.0.113.0/24`,
        );
    });
    if (c.securityGroup.sourceRanges.length === 0) {
      x.error(
        'aws.securityGroup.sourceRanges',
        'must list at least one CIDR range — the managed group admits only these sources',
      );
    }
  }
  if (c.publicIPv4 === false && c.ipv6 !== true) {
    x.error('aws.publicIPv4', 'is false and aws.ipv6 is not true: the proxies would have no public address');
  }
  if (c.maxPrice !== undefined) {
    if ((c.market ?? 'on-demand') !== 'spot') x.error('aws.maxPrice', 'is only used with market: spot');
    if (!AWS_PRICE.test(c.maxPrice) || Number(c.maxPrice) <= 0) {
      x.error('aws.maxPrice', `${q(c.maxPrice)} must be a positive price in USD per hour such as "0.01"`);
    }
  }
  if (c.endpoint !== undefined && !isHttpUrl(c.endpoint)) {
    x.error('aws.endpoint', `${q(c.endpoint)} must be an http(s) URL such as http://127.0.0.1:5000`);
  }
}

const hasControlCharacter = (s: string) => [...s].some((c) => c.charCodeAt(0) < 0x20 || c === '\x7f');

/**
 * Direct kernel boot (`kernel`, `initrd`, `cmdline` of a kvm image): paths on the hosts, so only
 * their form can be checked here; libvirt reports a missing file when the domain starts.
 */
function checkDirectBoot(image: KvmImage, at: string, x: Issues): void {
  const { kernel, initrd, cmdline } = image;
  for (const [field, path] of [
    ['kernel', kernel],
    ['initrd', initrd],
  ] as const) {
    if (path === undefined) continue;
    if (path === '') x.error(`${at}.${field}`, 'must not be empty (leave it out to boot from the disk)');
    else if (!path.startsWith('/')) {
      x.error(`${at}.${field}`, `${q(path)} must be an absolute path on the kvm hosts`);
    } else if (hasControlCharacter(path)) x.error(`${at}.${field}`, 'must not contain control characters');
  }
  if (kernel === undefined) {
    if (initrd !== undefined)
      x.error(`${at}.initrd`, 'needs kernel: an initrd is only used with direct kernel boot');
    if (cmdline !== undefined) {
      x.error(`${at}.cmdline`, 'needs kernel: a command line is only used with direct kernel boot');
    }
  }
  if (cmdline !== undefined && hasControlCharacter(cmdline)) {
    x.error(`${at}.cmdline`, 'must be one line without control characters');
  }
}

function checkKvm(c: KvmProviderConfig, x: Issues): void {
  nonEmpty(x, 'kvm.sshKeyFile', c.sshKeyFile);
  if (c.knownHostsFile === undefined && c.insecureIgnoreHostKey !== true) {
    x.error('kvm.knownHostsFile', 'is required unless insecureIgnoreHostKey is true');
  }
  nonEmpty(x, 'kvm.knownHostsFile', c.knownHostsFile);
  if (c.insecureIgnoreHostKey === true) {
    x.warn(
      'kvm.insecureIgnoreHostKey',
      'is true: SSH host keys are not verified, so a spoofed host would get the connection',
    );
  }
  for (const [key, image] of Object.entries(c.images ?? {})) {
    const at = childPath('kvm.images', key);
    if (!KVM_IDENTIFIER.test(key)) {
      x.error(
        at,
        'key must be letters, digits, dots, dashes or underscores — it becomes the cached volume name base-<key>.<format>',
      );
    }
    if (!isHttpUrl(image.url)) x.error(`${at}.url`, 'must be an http(s) URL with a host');
    if (image.sha256 !== undefined && !SHA256_HEX.test(image.sha256)) {
      x.error(`${at}.sha256`, 'must be 64 hex characters');
    }
    checkDirectBoot(image, at, x);
  }
  if (Object.keys(c.machineTypes).length === 0) {
    x.error('kvm.machineTypes', 'must define at least one machine type — placement.machineType names one');
  }
  for (const key of Object.keys(c.machineTypes)) {
    if (key.trim() === '') x.error(childPath('kvm.machineTypes', key), 'key must not be empty');
  }
  if (c.hosts.length === 0) x.error('kvm.hosts', 'must list at least one host');
  const seen = new Map<string, number>();
  c.hosts.forEach((h, i) => {
    const at = `kvm.hosts[${i}]`;
    if (h.name === '') x.error(`${at}.name`, 'is required');
    else if (!KVM_IDENTIFIER.test(h.name)) {
      x.error(
        `${at}.name`,
        `${q(h.name)} must be letters, digits, dots, dashes or underscores — it becomes part of the providerID hosts/<name>/domains/<vm>`,
      );
    }
    const first = seen.get(h.name);
    if (h.name !== '' && first !== undefined) {
      x.error(`${at}.name`, `duplicate host name ${q(h.name)} (also kvm.hosts[${first}])`);
    } else seen.set(h.name, i);
    if (h.address === '') x.error(`${at}.address`, 'is required');
    else if (!isHostPort(h.address))
      x.error(`${at}.address`, `${q(h.address)} must be host:port, e.g. nas1.lan:22`);
    if (h.user === '') x.error(`${at}.user`, 'is required');
    if (h.bridge === '') x.error(`${at}.bridge`, 'is required');
    if (h.socket !== undefined && !h.socket.startsWith('/'))
      x.error(`${at}.socket`, 'must be an absolute path');
    nonEmpty(x, `${at}.pool`, h.pool);
  });
}

function checkLocal(c: LocalProviderConfig, x: Issues): void {
  if (c.bindAddress !== undefined && isIP(c.bindAddress) === 0) {
    x.error('local.bindAddress', `${q(c.bindAddress)} must be an IP address such as 127.0.0.1`);
  }
  if (
    c.advertiseAddress !== undefined &&
    isIP(c.advertiseAddress) === 0 &&
    !HOSTNAME.test(c.advertiseAddress)
  ) {
    x.error('local.advertiseAddress', `${q(c.advertiseAddress)} must be a host name or an IP address`);
  }
  if (c.portRange) {
    const { from, to } = c.portRange;
    for (const [field, v] of [
      ['from', from],
      ['to', to],
    ] as const) {
      if (v < LOCAL_MIN_PORT) {
        x.error(
          `local.portRange.${field}`,
          `${v} must be between ${LOCAL_MIN_PORT} and 65535 — the operator runs unprivileged and cannot listen below ${LOCAL_MIN_PORT}`,
        );
      }
    }
    if (from > to) x.error('local.portRange', `from (${from}) must not be greater than to (${to})`);
  }
  if (c.egressAddresses !== undefined) {
    for (const p of egressAddressProblems(c.egressAddresses))
      x.error(`local.egressAddresses${p.field}`, p.message);
  }
}

/** The egress policy block every provider type carries (see config/egress). */
function checkEgressPolicy(p: EgressPolicyConfig, at: string, x: Issues): void {
  for (const field of ['allowCIDRs', 'denyCIDRs'] as const) {
    (p[field] ?? []).forEach((c, i) => {
      const problem = cidrProblem(c);
      if (problem) x.error(`${at}.${field}[${i}]`, `${q(c)} ${problem}`);
    });
  }
  (p.connectPorts ?? []).forEach((port, i) => {
    if (port < 1 || port > 65535) x.error(`${at}.connectPorts[${i}]`, `${port} is not a port (1-65535)`);
  });
  if (p.connectPorts?.length === 0) {
    x.warn(`${at}.connectPorts`, 'is empty: CONNECT is refused everywhere, so https:// cannot go through');
  }
}

const CHECKS: Record<ProviderEntry['type'], (e: ProviderEntry, x: Issues) => void> = {
  kubernetes: (e, x) => checkKubernetes(e.kubernetes ?? {}, x),
  gcp: (e, x) => e.gcp && checkGcp(e.gcp, x),
  kvm: (e, x) => e.kvm && checkKvm(e.kvm, x),
  local: (e, x) => checkLocal(e.local ?? {}, x),
  aws: (e, x) => e.aws && checkAws(e.aws, x),
};

/** Types whose block has required fields, so leaving it out cannot mean "all defaults". */
const BLOCK_REQUIRED: ReadonlySet<string> = new Set(['gcp', 'kvm', 'aws']);

function checkEntry(entry: ProviderEntry, x: Issues): void {
  if (entry.name.trim() === '') x.error('name', 'must not be empty');
  else if (entry.name.length > 253) {
    x.error('name', 'must be at most 253 characters — Proxy spec.provider cannot name a longer one');
  } else if (!isDnsSubdomain(entry.name)) {
    x.warn(
      'name',
      `${q(entry.name)} is not a valid Kubernetes object name (lower-case letters, digits, "-" and "."), so no ProviderHealth object is written for it; its metrics still are`,
    );
  }
  for (const t of PROVIDER_TYPES) {
    if (t !== entry.type && entry[t] !== undefined) {
      x.error(t, `is not allowed for type ${entry.type}; only the ${entry.type} block may be set`);
    }
  }
  if (BLOCK_REQUIRED.has(entry.type) && entry[entry.type] === undefined) {
    x.error(entry.type, `is required for type ${entry.type}`);
  }
  CHECKS[entry.type](entry, x);
  const policy = (entry[entry.type] as { egressPolicy?: EgressPolicyConfig } | undefined)?.egressPolicy;
  if (policy) checkEgressPolicy(policy, `${entry.type}.egressPolicy`, x);
}

/** Schema errors read as sentences after the path (`zone is not a known field; did you mean …`). */
function schemaLine(e: FieldError): string {
  return e.message.replace(/^unknown field/, 'is not a known field');
}

/**
 * Validates a parsed providers config. Shapes first; the rules of an entry run once its shape is
 * right. Returns every error and warning, never throws.
 */
export function validateProvidersConfig(raw: unknown): ProvidersConfigResult {
  const errors: ConfigIssue[] = [];
  const warnings: ConfigIssue[] = [];
  const entries = (raw as { providers?: unknown } | null)?.providers;
  const list = Array.isArray(entries) ? entries : [];
  const shapeBroken = new Set<number>();
  for (const e of schemaErrors(raw, validator.Errors(raw), [], ProvidersConfigSchema)) {
    const m = /^providers\[(\d+)\](.*)$/.exec(e.path);
    if (m) {
      const i = Number(m[1]);
      shapeBroken.add(i);
      const rel = m[2]!.replace(/^\./, '');
      errors.push({
        path: e.path,
        message: `${entryLabel(i, list[i])}${rel === '' ? '' : `${rel} `}${schemaLine(e)}`,
      });
    } else {
      errors.push({
        path: e.path,
        message: `${e.path === '' ? 'providers config' : e.path} ${schemaLine(e)}`,
      });
    }
  }
  if (raw !== null && typeof raw === 'object' && Array.isArray(entries)) {
    if (entries.length === 0) {
      warnings.push({
        path: 'providers',
        message: 'providers is empty: only External proxies can be served',
      });
    }
    const names = new Map<string, number>();
    entries.forEach((entry, i) => {
      const x = new Issues(`providers[${i}]`, entryLabel(i, entry));
      const name = (entry as { name?: unknown } | null)?.name;
      if (typeof name === 'string' && name !== '') {
        const first = names.get(name);
        if (first !== undefined)
          x.error('name', `duplicate provider name ${q(name)} (also providers[${first}])`);
        else names.set(name, i);
      }
      if (!shapeBroken.has(i)) checkEntry(entry as ProviderEntry, x);
      errors.push(...x.errors);
      warnings.push(...x.warnings);
    });
  }
  const gateway = (raw as { gateway?: GatewayConfig } | null)?.gateway;
  if (gateway && errors.every((e) => !e.path.startsWith('gateway'))) {
    const x = new Issues('gateway', 'gateway.');
    if (gateway.egressPolicy) checkEgressPolicy(gateway.egressPolicy, 'egressPolicy', x);
    const seen = new Map<string, number>();
    gateway.rules?.forEach((rule, i) => {
      for (const p of ruleProblems(rule, i, seen)) {
        const field = p.field === '' ? `rules[${i}]` : `rules[${i}].${p.field}`;
        if (p.warning) x.warn(field, p.message);
        else x.error(field, p.message);
      }
    });
    errors.push(...x.errors);
    warnings.push(...x.warnings);
  }
  return errors.length === 0
    ? { ok: true, value: raw as ProvidersConfig, warnings }
    : { ok: false, errors, warnings };
}

/** All issues as one text block, one per line. */
export function formatConfigIssues(issues: readonly ConfigIssue[]): string {
  return issues.map((i) => i.message).join('\n');
}
