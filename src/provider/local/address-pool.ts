/**
 * provider/local/address-pool — which source address (`local.egressAddresses`) each local proxy
 * connects from, and the sharing rule when there are more proxies than addresses. See
 * docs/providers/local.md, "Many egress IPs".
 *
 * A Proxy keeps its address: the one its instance name had earlier in this process, else the
 * one it had before (`status.egressIP`, persisted in the object store, passed as the create
 * hint), so replacements and restarts leave from the same address. A Proxy without one gets a
 * free address, trying the list from a slot hashed from its UID; addresses other existing
 * Proxies hold in status count as taken, so after a restart a new Proxy created first cannot
 * take an address an older one is about to come back to. When none is free, it shares the
 * address the fewest other Proxies use (earliest in that order on a tie): the lease store treats
 * proxies sharing an address as one exit for `blocked` reports, so sharing is safe, only less
 * spread.
 */
import { createHash } from 'node:crypto';

/** An address some Proxy holds in status (`status.egressIP`) on this provider. */
export interface EgressReservation {
  address: string;
  uid: string;
}

/** The address chosen, and how many other Proxies already use it (0 = it is this Proxy's own). */
export interface EgressChoice {
  address: string;
  sharedWith: number;
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

  /** The address for instance `name` of the Proxy `uid`, recorded as held (see the header for the rule). */
  take(
    name: string,
    uid: string,
    hint: string | undefined,
    reserved: readonly EgressReservation[],
  ): EgressChoice {
    const users = new Map<string, Set<string>>();
    const use = (a: string, u: string) => {
      if (u === uid) return;
      let s = users.get(a);
      if (!s) {
        s = new Set();
        users.set(a, s);
      }
      s.add(u);
    };
    for (const [a, held] of this.holders) for (const u of held.values()) use(a, u);
    for (const r of reserved) use(r.address, r.uid);
    const load = (a: string) => users.get(a)?.size ?? 0;
    const own = [this.last.get(name), hint].find((a) => a !== undefined && this.index.has(a));
    let address = own;
    if (address === undefined) {
      for (const a of this.byHash(uid)) if (address === undefined || load(a) < load(address)) address = a;
    }
    const chosen = address as string;
    let held = this.holders.get(chosen);
    if (!held) {
      held = new Map();
      this.holders.set(chosen, held);
    }
    held.set(name, uid);
    this.last.set(name, chosen);
    return { address: chosen, sharedWith: load(chosen) };
  }

  /** The instance stopped: its address is free for others (it stays remembered for `name`). */
  release(name: string): void {
    const a = this.last.get(name);
    if (a !== undefined) this.holders.get(a)?.delete(name);
  }

  /** The whole list, starting at the slot hashed from the Proxy UID. */
  private byHash(uid: string): string[] {
    const n = this.addresses.length;
    const first = createHash('sha256').update(uid).digest().readUInt32BE(0) % n;
    return Array.from({ length: n }, (_, i) => this.addresses[(first + i) % n] as string);
  }
}
