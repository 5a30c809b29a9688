/**
 * provider/local/address-pool — which source address (`local.egressAddresses`) each local proxy
 * connects from: one address per Proxy, never two Proxies on one address (a replacement
 * instance shares its own Proxy's address), and stable across restarts. See
 * docs/providers/local.md, "Many egress IPs".
 *
 * Stability comes from, in order: the address the instance name had earlier in this process;
 * the address the Proxy had before (`status.egressIP`, persisted in the object store, passed
 * as the create hint); and a hash of the Proxy UID into the list. Addresses other existing
 * Proxies hold in status are reserved for them, so after a restart a new Proxy created first
 * cannot take an address an older Proxy is about to come back to; deleting a Proxy frees its
 * address.
 */
import { createHash } from 'node:crypto';

/** An address some Proxy holds in status (`status.egressIP`) on this provider. */
export interface EgressReservation {
  address: string;
  uid: string;
}

export class EgressAddressPool {
  readonly addresses: readonly string[];
  private readonly index: ReadonlyMap<string, number>;
  /** Running instances per address: instance name → Proxy UID. */
  private readonly holders = new Map<string, Map<string, string>>();
  /** Address each instance name had, so a re-created instance gets it back. */
  private readonly last = new Map<string, string>();

  constructor(addresses: readonly string[]) {
    this.addresses = addresses;
    this.index = new Map(addresses.map((a, i) => [a, i]));
  }

  /** Addresses with no running instance. */
  get free(): number {
    return this.addresses.filter((a) => !this.holders.get(a)?.size).length;
  }

  /**
   * The address for instance `name` of the Proxy `uid`, recorded as held; undefined when every
   * address belongs to another Proxy (the caller reports QuotaExceeded).
   */
  take(
    name: string,
    uid: string,
    hint: string | undefined,
    reserved: readonly EgressReservation[],
  ): string | undefined {
    const others = new Set(reserved.filter((r) => r.uid !== uid).map((r) => r.address));
    const mine = (a: string) => [...(this.holders.get(a)?.values() ?? [])].every((u) => u === uid);
    const chosen = this.candidates(name, uid, hint).find((a) => mine(a) && !others.has(a));
    if (chosen === undefined) return undefined;
    let held = this.holders.get(chosen);
    if (!held) {
      held = new Map();
      this.holders.set(chosen, held);
    }
    held.set(name, uid);
    this.last.set(name, chosen);
    return chosen;
  }

  /** The instance stopped: its address is free for others (it stays remembered for `name`). */
  release(name: string): void {
    const a = this.last.get(name);
    if (a !== undefined) this.holders.get(a)?.delete(name);
  }

  /** Remembered, hinted, then the whole list from the UID's hash slot onwards. */
  private candidates(name: string, uid: string, hint: string | undefined): string[] {
    const out: string[] = [];
    for (const a of [this.last.get(name), hint]) {
      if (a !== undefined && this.index.has(a) && !out.includes(a)) out.push(a);
    }
    const n = this.addresses.length;
    const first = n === 0 ? 0 : createHash('sha256').update(uid).digest().readUInt32BE(0) % n;
    for (let i = 0; i < n; i++) {
      const a = this.addresses[(first + i) % n] as string;
      if (!out.includes(a)) out.push(a);
    }
    return out;
  }
}
