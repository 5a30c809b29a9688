/**
 * lease/cooldowns — when a proxy may not be leased for a while: globally (a `failed` report), or
 * for one target (a `blocked` report, shared by every proxy leaving from the same address,
 * lease/egress-groups). Per-target cooldowns live in one capped heap (lease/target-cooldowns);
 * global ones in a heap of their ends, so a proxy comes back into the selection when its
 * cooldown ends even without traffic. Cooldowns only ever lengthen.
 */
import type { Logger } from 'pino';
import type { ChangeCounter } from './changes.ts';
import { EgressGroups } from './egress-groups.ts';
import type { Entry } from './entry.ts';
import { IndexedHeap } from './ordered.ts';
import type { Selection } from './selection.ts';
import { type CooldownWatcher, TargetCooldowns } from './target-cooldowns.ts';
import type { ReportRequest } from './types.ts';

export interface CooldownOptions {
  blockedCooldownSeconds: number;
  failedCooldownSeconds: number;
  /** Per-target cooldown entries at most, fleet-wide (and address blocks, lease/egress-groups). */
  maxTargetCooldowns: number;
  onCooldownEvicted: () => void;
  /** Asked to re-probe a proxy reported `failed`. */
  requestProbe: ((key: string) => void) | undefined;
  log: Logger;
}

interface GlobalCooldownEnd {
  at: number;
  entry: Entry;
  heapIndex: number;
}

export class Cooldowns {
  private readonly opts: CooldownOptions;
  private readonly selection: Selection;
  private readonly changes: ChangeCounter;
  private readonly targets: TargetCooldowns;
  private readonly egressGroups: EgressGroups;
  private readonly globalEnds = new IndexedHeap<GlobalCooldownEnd>((a, b) => a.at < b.at);

  constructor(opts: CooldownOptions, selection: Selection, changes: ChangeCounter) {
    this.opts = opts;
    this.selection = selection;
    this.changes = changes;
    this.targets = new TargetCooldowns(opts.maxTargetCooldowns, opts.onCooldownEvicted, (e, target, sign) =>
      selection.cooling(e, target, sign),
    );
    this.egressGroups = new EgressGroups(opts.maxTargetCooldowns);
  }

  /** Per-target cooldown entries held (ended ones until the next purge). */
  get targetCount(): number {
    return this.targets.size;
  }

  /** Calls `w` for every per-target cooldown that begins or lengthens; returns the unsubscribe. */
  watch(w: CooldownWatcher): () => void {
    return this.targets.watch(w);
  }

  /**
   * What a report does to a proxy: `blocked` cools it down for `target` (with every proxy
   * sharing its egress IP), `failed` for everyone plus a re-probe.
   */
  report(e: Entry, target: string | undefined, req: ReportRequest, now: number): void {
    const { blockedCooldownSeconds, failedCooldownSeconds, log } = this.opts;
    if (req.result !== 'success') {
      // Which site refuses which proxy, and which proxies fail: worth a line each (never the lease id).
      const cooldownSeconds =
        req.cooldownSeconds ?? (req.result === 'blocked' ? blockedCooldownSeconds : failedCooldownSeconds);
      log.info({ proxy: e.key, target, result: req.result, cooldownSeconds }, 'proxy reported');
    }
    if (req.result === 'blocked' && target !== undefined) {
      const until = now + (req.cooldownSeconds ?? blockedCooldownSeconds) * 1000;
      // The site blocked an address: every proxy leaving from it is blocked there too.
      this.egressGroups.block(e, target, until, this.targets);
      this.changes.decided();
    } else if (req.result === 'failed') {
      this.coolDown(e, now + (req.cooldownSeconds ?? failedCooldownSeconds) * 1000);
      try {
        this.opts.requestProbe?.(e.key);
      } catch (err) {
        log.warn({ err, proxy: e.key }, 'requestProbe hook failed');
      }
    }
  }

  /** Keeps `e` from every grant until `until`. */
  coolDown(e: Entry, until: number): void {
    if (until <= e.globalUntil) return;
    this.changes.decided();
    this.selection.update(e, () => {
      e.globalUntil = until;
    });
    this.globalEnds.push({ at: until, entry: e, heapIndex: -1 });
  }

  /** Keeps `e` from grants for `target` until `until` (a restored cooldown: no address spread). */
  coolDownForTarget(e: Entry, target: string, until: number): void {
    this.targets.set(e, target, until);
  }

  /** Moves `e` to the egress group of `address`, taking on that address's live blocks. */
  place(e: Entry, address: string | undefined, now: number): void {
    this.egressGroups.place(e, address, this.targets, now);
  }

  /** Takes `e` out of its egress group (it left the fleet). */
  leave(e: Entry): void {
    this.egressGroups.leave(e);
  }

  /** Forgets what ended by `now` and lets proxies whose global cooldown ended back in. */
  purge(now: number): void {
    this.targets.purge(now);
    this.egressGroups.purge(now);
    for (let top = this.globalEnds.peek(); top && top.at <= now; top = this.globalEnds.peek()) {
      this.globalEnds.pop();
      const e = top.entry;
      if (!e.indexed && e.globalUntil <= now) this.selection.update(e, () => {});
    }
  }
}
