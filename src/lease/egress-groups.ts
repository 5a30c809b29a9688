/**
 * lease/egress-groups — proxies that leave from one source address (`status.egressIP`, from any
 * provider) are one exit to a site: a `blocked` report on one cools down all of them for that
 * target, and a proxy that takes the address later (a new Proxy given a freed address, a proxy
 * whose egress IP changed) takes on the blocks the address still has. See docs/lease-api.md.
 *
 * The address's own blocks are kept until they end, also while no proxy uses it, in a heap by
 * end time under the same kind of cap as the per-target cooldowns. They are not checkpointed:
 * after a restart they come back from the members' own cooldowns (which are), copied to a proxy
 * when it joins.
 *
 * A cooldown a proxy takes on this way remembers where it came from (the reported proxy and the
 * address), so nobody reads it as that proxy's own block (the dashboard shows both).
 */

import type { Entry } from './entry.ts';
import { IndexedHeap } from './ordered.ts';
import { DEFAULT_MAX_TARGET_COOLDOWNS, type TargetCooldowns } from './target-cooldowns.ts';
import type { CooldownOrigin } from './types.ts';

interface AddressBlock {
  at: number;
  address: string;
  target: string;
  /** Key of the proxy whose report set (or last lengthened) it. */
  by: string;
  heapIndex: number;
}

/** The origin of a cooldown `e` takes on from `proxy` on `address`; none when it is `e`'s own. */
function origin(e: Entry, proxy: string, address: string): CooldownOrigin | undefined {
  return proxy === e.key ? undefined : { proxy, address };
}

export class EgressGroups {
  private readonly byAddress = new Map<string, Set<Entry>>();
  private readonly blocks = new Map<string, Map<string, AddressBlock>>();
  private readonly ends = new IndexedHeap<AddressBlock>((a, b) => a.at < b.at);
  private readonly max: number;

  constructor(max = DEFAULT_MAX_TARGET_COOLDOWNS) {
    this.max = Math.max(1, max);
  }

  /**
   * Blocks `target` until `until` for every proxy leaving from `e`'s address (`e` alone when it
   * has none), and for whoever takes the address before then.
   */
  block(e: Entry, target: string, until: number, cooldowns: TargetCooldowns): void {
    cooldowns.set(e, target, until);
    const address = e.egressIP;
    if (address === undefined) return;
    const from: CooldownOrigin = { proxy: e.key, address };
    for (const peer of this.byAddress.get(address) ?? [])
      if (peer !== e) cooldowns.set(peer, target, until, from);
    this.remember(address, target, until, e.key);
  }

  /**
   * Moves `e` to the group of `address` (none when undefined). Joining copies the address's
   * live blocks and the peers' live target cooldowns onto `e`; cooldowns it brings from an old
   * address stay until they end.
   */
  place(e: Entry, address: string | undefined, cooldowns: TargetCooldowns, now: number): void {
    if (e.egressIP === address) return;
    this.leave(e);
    if (address === undefined) {
      delete e.egressIP;
      return;
    }
    e.egressIP = address;
    let group = this.byAddress.get(address);
    if (!group) {
      group = new Set();
      this.byAddress.set(address, group);
    }
    for (const b of this.blocks.get(address)?.values() ?? [])
      if (b.at > now) cooldowns.set(e, b.target, b.at, origin(e, b.by, address));
    for (const peer of group) {
      for (const c of peer.targetUntil.values()) {
        if (c.at > now)
          cooldowns.set(
            e,
            c.target,
            c.at,
            c.from ? origin(e, c.from.proxy, address) : origin(e, peer.key, address),
          );
      }
    }
    group.add(e);
  }

  /** Takes `e` out of its group (it left the fleet or its address changed). */
  leave(e: Entry): void {
    if (e.egressIP === undefined) return;
    const group = this.byAddress.get(e.egressIP);
    group?.delete(e);
    if (group?.size === 0) this.byAddress.delete(e.egressIP);
  }

  /** Forgets the address blocks that have ended by `now`. */
  purge(now: number): void {
    for (let top = this.ends.peek(); top && top.at <= now; top = this.ends.peek()) this.forget(top);
  }

  private remember(address: string, target: string, until: number, by: string): void {
    let byTarget = this.blocks.get(address);
    if (!byTarget) {
      byTarget = new Map();
      this.blocks.set(address, byTarget);
    }
    const current = byTarget.get(target);
    if (current) {
      if (until > current.at) {
        current.at = until;
        current.by = by;
        this.ends.update(current);
      }
      return;
    }
    const fresh: AddressBlock = { at: until, address, target, by, heapIndex: -1 };
    byTarget.set(target, fresh);
    this.ends.push(fresh);
    while (this.ends.size > this.max) {
      const soonest = this.ends.peek();
      if (!soonest) break;
      this.forget(soonest);
    }
  }

  private forget(b: AddressBlock): void {
    this.ends.remove(b);
    const byTarget = this.blocks.get(b.address);
    if (byTarget?.get(b.target) !== b) return;
    byTarget.delete(b.target);
    if (byTarget.size === 0) this.blocks.delete(b.address);
  }
}
