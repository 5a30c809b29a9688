/**
 * lease/census — the refusal funnel of one view (namespace, selector), kept as counts that move
 * with every change to an entry, so a refused grant answers its "why nothing" arithmetic without
 * walking the fleet (see docs/lease-api.md, 409 body). Target aside, every entry stands in exactly one
 * place of the funnel; per-target cooldowns are tallied only for targets a refusal has asked
 * about (LRU-bounded), each tally built by one walk the first time and kept incrementally after.
 */
import type { Entry, Standing } from './entry.ts';
import type { NoneLeasableCounts } from './types.ts';

/** Standings a per-target cooldown is the next rule for (the funnel checks it before capacity). */
export function reachesTargetRule(s: Standing | undefined): boolean {
  return s === 'leasable' || s === 'atCapacity';
}

/** Entries reaching the target rule that cool down for one target, and how many of them are full. */
interface Tally {
  cooling: number;
  coolingAtCapacity: number;
}

/** Targets tallied per view, least recently asked dropped first. */
const MAX_TALLIES = 64;

export class Census {
  private matching = 0;
  private readonly by: Record<Standing, number> = {
    notReady: 0,
    unhealthy: 0,
    draining: 0,
    coolingDown: 0,
    atCapacity: 0,
    leasable: 0,
  };
  /** Per-target tallies, in LRU order (oldest first). */
  private readonly tallies = new Map<string, Tally>();

  /** Counts `e` (standing `s`) in (sign 1) or out (sign -1), with its target cooldowns. */
  count(e: Entry, s: Standing, sign: 1 | -1): void {
    this.matching += sign;
    this.by[s] += sign;
    if (this.tallies.size === 0 || !reachesTargetRule(s) || e.targetUntil.size === 0) return;
    const full = s === 'atCapacity';
    if (e.targetUntil.size <= this.tallies.size) {
      for (const target of e.targetUntil.keys()) this.tallyOne(target, full, sign);
    } else {
      for (const [target, t] of this.tallies) {
        if (!e.targetUntil.has(target)) continue;
        t.cooling += sign;
        if (full) t.coolingAtCapacity += sign;
      }
    }
  }

  /** A cooldown for `target` began (1) or ended (-1) on an entry that reaches the target rule. */
  tallyOne(target: string, full: boolean, sign: 1 | -1): void {
    const t = this.tallies.get(target);
    if (!t) return;
    t.cooling += sign;
    if (full) t.coolingAtCapacity += sign;
  }

  /**
   * The funnel for `target`. A target not tallied yet is tallied from `entries` (every counted
   * entry of this view) once; later refusals for it cost O(1).
   */
  funnel(target: string | undefined, entries: () => Iterable<Entry>): NoneLeasableCounts {
    const ready = this.matching - this.by.notReady;
    const healthy = ready - this.by.unhealthy;
    const tally =
      target === undefined ? { cooling: 0, coolingAtCapacity: 0 } : this.tallyFor(target, entries);
    return {
      matching: this.matching,
      ready,
      healthy,
      draining: this.by.draining,
      coolingDown: this.by.coolingDown,
      coolingDownForTarget: tally.cooling,
      atCapacity: this.by.atCapacity - tally.coolingAtCapacity,
    };
  }

  private tallyFor(target: string, entries: () => Iterable<Entry>): Tally {
    let t = this.tallies.get(target);
    if (t) {
      this.tallies.delete(target);
      this.tallies.set(target, t);
      return t;
    }
    t = { cooling: 0, coolingAtCapacity: 0 };
    for (const e of entries()) {
      if (!reachesTargetRule(e.standing) || !e.targetUntil.has(target)) continue;
      t.cooling++;
      if (e.standing === 'atCapacity') t.coolingAtCapacity++;
    }
    this.tallies.set(target, t);
    if (this.tallies.size > MAX_TALLIES) {
      const oldest = this.tallies.keys().next().value;
      if (oldest !== undefined) this.tallies.delete(oldest);
    }
    return t;
  }
}
