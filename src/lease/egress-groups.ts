/**
 * lease/egress-groups — proxies that leave from one source address (`status.egressIP`, from any
 * provider) are one exit to a site: a `blocked` report on one cools down all of them for that
 * target, and a proxy that joins an address later takes on the cooldowns its new peers carry.
 * The group's cooldowns are the union of its members' per-target cooldowns, so they need no
 * state of their own and survive a checkpoint as the members' cooldowns do. See docs/api.md.
 */
import type { TargetCooldowns } from './cooldowns.ts';
import type { Entry } from './entry.ts';

export class EgressGroups {
  private readonly byAddress = new Map<string, Set<Entry>>();

  /** The entries leaving from the same address as `e`, `e` included (only `e` when it has none). */
  sharing(e: Entry): Entry[] {
    const group = e.egressIP === undefined ? undefined : this.byAddress.get(e.egressIP);
    if (!group) return [e];
    return group.has(e) ? [...group] : [e, ...group];
  }

  /**
   * Moves `e` to the group of `address` (none when undefined). Joining copies the peers' live
   * target cooldowns onto `e`; cooldowns it brings from an old address stay until they end.
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
    for (const peer of group) {
      for (const c of peer.targetUntil.values()) if (c.at > now) cooldowns.set(e, c.target, c.at);
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
}
