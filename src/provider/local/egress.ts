/**
 * provider/local/egress — decides where a local forward proxy may connect on a lease holder's
 * behalf (docs/operations.md, "Security model"): the port against connectPorts, then every
 * address the target resolves to against the provider's deny list and the operator's own ports.
 * The decision returns the checked address and the proxy connects to exactly that address, so a
 * name cannot resolve to something else between the check and the connect.
 */
import { lookup as dnsLookup } from 'node:dns/promises';
import { isIP } from 'node:net';
import { networkInterfaces } from 'node:os';
import {
  canonicalAddressText,
  deniedAddressMatcher,
  type EgressPolicy,
  resolveEgressPolicy,
} from '../../config/egress.ts';

/** Why a request was refused (the `reason` label of the denial counter). */
export type DenialReason = 'port' | 'address' | 'operator-port';

export type EgressDecision =
  | { allowed: true; address: string }
  | { allowed: false; reason: DenialReason }
  | { allowed: false; reason: 'unresolvable'; error: unknown };

/** The operator's own listeners, which a lease holder must not reach through a proxy. */
export interface OperatorPorts {
  /** Ports the operator listens on (discovery API, metrics, health probes, the proxies). */
  isOwnPort: (port: number) => boolean;
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

  constructor(policy: EgressPolicy = resolveEgressPolicy(), operator?: OperatorPorts, lookup?: Lookup) {
    this.policy = policy;
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
    if (!probe && !ports.includes(port)) return { allowed: false, reason: 'port' };
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
    if (!ports.includes(port)) return { allowed: false, reason: 'port' };
    if (local.some(Boolean) && this.operator.isOwnPort(port))
      return { allowed: false, reason: 'operator-port' };
    if (addresses.some(this.denied)) return { allowed: false, reason: 'address' };
    return dialled ? { allowed: true, address: dialled } : noneOfFamily;
  }
}
