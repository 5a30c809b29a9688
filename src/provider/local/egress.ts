/**
 * provider/local/egress — decides where a local forward proxy may connect on a lease holder's
 * behalf (docs/operations.md, "Security model"): the port against connectPorts, then every
 * address the target resolves to against the provider's deny list and the operator's own ports.
 * The decision returns the checked address and the proxy connects to exactly that address, so a
 * name cannot resolve to something else between the check and the connect. A refusal carries
 * one line naming the rule that refused and the config field that would open it (explainRefusal),
 * which the local proxies and the gateway send as `X-Egress-Policy`, in the body and to the log.
 */
import { lookup as dnsLookup } from 'node:dns/promises';
import { isIP } from 'node:net';
import { networkInterfaces } from 'node:os';
import {
  canonicalAddressText,
  deniedAddressMatcher,
  denyingRule,
  type EgressPolicy,
  type EgressPolicyConfig,
  resolveEgressPolicy,
} from '../../config/egress.ts';

/** Why a request was refused (the `reason` label of the denial counter). */
export type DenialReason = 'port' | 'address' | 'operator-port';

export type EgressDecision =
  | { allowed: true; address: string }
  | { allowed: false; reason: DenialReason; rule: string }
  | { allowed: false; reason: 'unresolvable'; error: unknown };

/** Every refusal's body starts with this; `: ` and the rule that refused follow. */
export const EGRESS_REFUSAL = 'destination not allowed by the egress policy';
/** Response header naming the rule that refused and the setting that would open it. */
export const EGRESS_POLICY_HEADER = 'X-Egress-Policy';
/** A header line stays short: the rule is a sentence, a host name at most 253 characters. */
const MAX_RULE_LENGTH = 768;

/** Where the policy a guard applies is configured, so a refusal can name the field that opens it. */
export interface PolicySource {
  /** The block's path: `providers[lab].local.egressPolicy`, `gateway.egressPolicy`. */
  field: string;
  /** The block as configured: tells a default range from a `denyCIDRs` entry. */
  config?: EgressPolicyConfig;
}

/** What refused a request, in the terms the guard checked it in. */
export type Refusal =
  | { reason: 'port'; port: number; http: boolean; connectPorts: readonly number[] }
  | { reason: 'address'; host: string; address: string }
  | { reason: 'operator-port'; port: number; listener?: string; probe: boolean };

/** Client-supplied text inside a header value: printable ASCII only, bounded. */
function printable(s: string, max = 253): string {
  const clean = s.replace(/[^\x20-\x7e]/g, '?');
  return clean.length > max ? `${clean.slice(0, max)}...` : clean;
}

/**
 * The rule that refused and the setting that would open it, as one printable-ASCII line (fit
 * for a header), so a refused user learns what to change without reading the source. It holds
 * only what the request named and the policy's own ranges and ports, never credentials.
 */
export function explainRefusal(r: Refusal, source: PolicySource, policy: EgressPolicy): string {
  return printable(explain(r, source, policy), MAX_RULE_LENGTH);
}

function explain(r: Refusal, source: PolicySource, policy: EgressPolicy): string {
  const field = source.field;
  switch (r.reason) {
    case 'port': {
      const open = `to allow it, add it to ${field}.connectPorts`;
      const list = r.connectPorts.join(', ') || 'none';
      return r.http
        ? `port ${r.port} is not one plain http:// may use (80 and connectPorts: ${list}); ${open}`
        : `port ${r.port} is not in connectPorts (${list}); ${open}`;
    }
    case 'operator-port': {
      const what = r.listener ? `the operator's ${r.listener}` : "one of the operator's own listeners";
      const probe = r.probe ? `; only GET or HEAD ${PROBE_PATH} passes there` : '';
      return `port ${r.port} on this host is ${what}; no egress setting opens the operator's own listeners${probe}`;
    }
    case 'address':
      return explainAddress(r.host, r.address, source, policy);
  }
}

function explainAddress(host: string, address: string, source: PolicySource, policy: EgressPolicy): string {
  const shown = printable(host);
  // A name shows what it resolved to; a literal in another spelling (::ffff:…) its canonical form.
  const subject =
    host === address
      ? address
      : isIP(host)
        ? `${shown} is ${address}, which`
        : `${shown} resolves to ${address}, which`;
  const rule = denyingRule(address, source.config, policy);
  if (!rule) return `${subject} is not an IP address the policy can check`;
  const via = rule.embedded ? ` embeds ${rule.embedded.address} (${rule.embedded.via}), which` : '';
  const opened = rule.embedded?.address ?? address;
  switch (rule.source) {
    case 'denyCIDRs':
      return `${subject}${via} is in ${rule.cidr} (denyCIDRs); to allow it, remove ${rule.cidr} from ${source.field}.denyCIDRs`;
    case 'default':
      return `${subject}${via} is in ${rule.cidr} (${rule.what}), denied by default; to allow it, add a range covering ${opened} to ${source.field}.allowCIDRs`;
    case 'policy':
      return `${subject} is in ${rule.cidr}, which ${source.field} denies`;
  }
}

/** The operator's own listeners, which a lease holder must not reach through a proxy. */
export interface OperatorPorts {
  /** Ports the operator listens on (discovery API, metrics, health probes, the proxies). */
  isOwnPort: (port: number) => boolean;
  /** Which listener an own port is, with what moves it: `discovery API (--discovery-bind-address)`. */
  describe?: (port: number) => string | undefined;
  /**
   * Port of the operator's discovery API: `GET`/`HEAD` of exactly `/generate_204` on this host is
   * let through, so proxies can be health-checked against the operator itself (offline setups,
   * the standalone example). That route is public, answers 204 and changes nothing.
   */
  probePort?: number;
}

/** The probe route of the discovery API (see docs/lease-api.md). */
export const PROBE_PATH = '/generate_204';

export type Lookup = (host: string) => Promise<string[]>;

const systemLookup: Lookup = async (host) =>
  (await dnsLookup(host, { all: true, verbatim: true })).map((a) => a.address);

/** A plain-HTTP request as the probe exception sees it. */
export interface HttpRequestTarget {
  method: string;
  /** Path and query as sent (`/generate_204`, `/x?y`). */
  path: string;
}

const LOOPBACK_OR_UNSPECIFIED = deniedAddressMatcher({
  deniedCIDRs: ['0.0.0.0/8', '127.0.0.0/8', '::/128', '::1/128'],
  connectPorts: [],
  httpPorts: [],
});

/** Whether an address reaches this machine: loopback, unspecified, or one of its interfaces. */
export function isThisHost(address: string): boolean {
  if (LOOPBACK_OR_UNSPECIFIED(address)) return true;
  const own = canonicalAddressText(address);
  if (own === undefined) return false;
  return Object.values(networkInterfaces()).some((list) =>
    (list ?? []).some((i) => canonicalAddressText(i.address.split('%')[0] as string) === own),
  );
}

export class EgressGuard {
  readonly policy: EgressPolicy;
  private readonly denied: (address: string) => boolean;
  private readonly operator: OperatorPorts;
  private readonly lookup: Lookup;
  private readonly source: PolicySource;

  /** `source` names the config block `policy` was resolved from, for the refusals' explanations. */
  constructor(
    policy: EgressPolicy = resolveEgressPolicy(),
    operator?: OperatorPorts,
    lookup?: Lookup,
    source: PolicySource = { field: 'egressPolicy' },
  ) {
    this.policy = policy;
    this.source = source;
    this.denied = deniedAddressMatcher(policy);
    this.operator = operator ?? { isOwnPort: () => false };
    this.lookup = lookup ?? systemLookup;
  }

  /**
   * Where a CONNECT (`http` undefined) or an absolute-form http:// request may go. Ports are
   * checked before any DNS lookup, so a refused port costs nothing. A proxy bound to a source
   * address of one `family` connects to an address of that family: every address is still
   * checked, and a target with none of that family does not resolve for this proxy.
   */
  async decide(
    host: string,
    port: number,
    http?: HttpRequestTarget,
    family?: 4 | 6,
  ): Promise<EgressDecision> {
    const probe =
      http !== undefined &&
      port === this.operator.probePort &&
      (http.method === 'GET' || http.method === 'HEAD') &&
      http.path === PROBE_PATH;
    const ports = http ? this.policy.httpPorts : this.policy.connectPorts;
    const portRefusal = (): EgressDecision =>
      this.refuse({ reason: 'port', port, http: http !== undefined, connectPorts: this.policy.connectPorts });
    if (!probe && !ports.includes(port)) return portRefusal();
    let addresses: string[];
    try {
      addresses = isIP(host) ? [host] : await this.lookup(host);
    } catch (error) {
      return { allowed: false, reason: 'unresolvable', error };
    }
    // Checked and dialled as the address a socket reaches: `::ffff:1.2.3.4` is 1.2.3.4, and a
    // proxy bound to an IPv4 source takes it. What is no address at all stays, to be denied.
    addresses = addresses.map((a) => canonicalAddressText(a) ?? a);
    if (addresses.length === 0) return { allowed: false, reason: 'unresolvable', error: undefined };
    // Every address is checked: the client cannot choose which one gets connected.
    const local = addresses.map(isThisHost);
    const dialled = family === undefined ? addresses[0] : addresses.find((a) => isIP(a) === family);
    const noneOfFamily: EgressDecision = {
      allowed: false,
      reason: 'unresolvable',
      error: new Error(`${host} has no IPv${family} address`),
    };
    if (probe && local.every(Boolean)) return dialled ? { allowed: true, address: dialled } : noneOfFamily;
    if (!ports.includes(port)) return portRefusal();
    if (local.some(Boolean) && this.operator.isOwnPort(port)) {
      const listener = this.operator.describe?.(port);
      return this.refuse({
        reason: 'operator-port',
        port,
        probe: port === this.operator.probePort,
        ...(listener === undefined ? {} : { listener }),
      });
    }
    const denied = addresses.find(this.denied);
    if (denied !== undefined) return this.refuse({ reason: 'address', host, address: denied });
    return dialled ? { allowed: true, address: dialled } : noneOfFamily;
  }

  private refuse(r: Refusal): EgressDecision {
    return { allowed: false, reason: r.reason, rule: explainRefusal(r, this.source, this.policy) };
  }
}
