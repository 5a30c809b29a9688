/**
 * lease/selection — choosing a proxy without scanning the fleet. Every eligible proxy (see
 * lease/entry) sits in a *view* (lease/view): buckets by active-lease count, each a sorted list
 * by (least recently leased, latency, name). A grant walks the lowest bucket from the front; for
 * a target many proxies cool down for, the view keeps the proxies not cooling for it, so the
 * walk does not skip them one by one. Views exist per distinct (namespace, selector) a client
 * asks for (LRU-bounded); the unfiltered view always exists. Cost per grant: O(views + log n).
 *
 * A refused grant's "why nothing" counts come from each view's census (lease/census), kept as
 * proxies change: O(1), after one walk the first time a view is refused for a target; its retryAt
 * (lease/retry-at) walks the view's proxies once and is kept until anything in the store changes.
 * Every change to a proxy goes through `update`, which keeps views and censuses in step.
 */
import type { Clock } from '../runtime/clock.ts';
import type { Selector } from '../runtime/selector.ts';
import type { ChangeCounter } from './changes.ts';
import { type Entry, standingOf } from './entry.ts';
import type { Lease } from './lease.ts';
import { earliestLeaseEnds, retryAt } from './retry-at.ts';
import type { NoneLeasableCounts } from './types.ts';
import { type View, ViewSet } from './view.ts';

export interface SelectionOptions {
  /** Bound on cached (namespace, selector) views. */
  maxViews: number;
  /** Proxies a grant may skip for its target's cooldowns before a per-target view is kept. */
  hotTargetSkips: number | undefined;
}

/** What a refusal reads besides the views: the whole fleet and the live leases. */
export interface SelectionSources {
  proxies(): Iterable<Entry>;
  leases(): Iterable<Lease>;
}

export interface Refusal {
  counts: NoneLeasableCounts;
  /** Earliest time (ms) a matching proxy may be leasable for the target; undefined: none by itself. */
  retryAt: number | undefined;
}

export class Selection {
  private readonly views: ViewSet;
  private readonly clock: Clock;
  private readonly changes: ChangeCounter;
  private readonly sources: SelectionSources;

  constructor(opts: SelectionOptions, clock: Clock, changes: ChangeCounter, sources: SelectionSources) {
    this.views = new ViewSet(opts.maxViews, opts.hotTargetSkips);
    this.clock = clock;
    this.changes = changes;
    this.sources = sources;
  }

  /** The view of a filter, built from the fleet the first time a client asks for it. */
  view(namespace: string | undefined, selector: Selector | undefined): View {
    return this.views.get(namespace, selector, this.sources.proxies());
  }

  /**
   * Why `view` has nothing for `target`. The retryAt walk over the view's proxies and the live
   * leases is kept for repeated refusals until anything in the store changes.
   */
  refusal(view: View, target: string | undefined, now: number): Refusal {
    const counts = view.refusal(target, this.sources.proxies());
    const at = view.retryAt(target, this.changes.revision, () =>
      retryAt(view.counted(this.sources.proxies()), target, now, earliestLeaseEnds(this.sources.leases())),
    );
    return { counts, retryAt: at };
  }

  /**
   * Takes `e` out of every view and census, applies the change, and puts it back where it now
   * belongs. While `mutate` runs `e` is uncounted, so cooldowns set inside it are counted once,
   * afterwards.
   */
  update(e: Entry, mutate: () => void): void {
    this.changes.touched();
    if (e.indexed) {
      this.views.remove(e);
      e.indexed = false;
    }
    if (e.standing !== undefined) {
      this.views.count(e, e.standing, -1);
      e.standing = undefined;
    }
    mutate();
    const standing = standingOf(e, this.clock.now());
    if (standing === undefined) return;
    e.standing = standing;
    this.views.count(e, standing, 1);
    if (standing === 'leasable') {
      this.views.add(e);
      e.indexed = true;
    }
  }

  /** A cooldown of `e` for `target` began (1) or ended (-1): the censuses' tallies follow. */
  cooling(e: Entry, target: string, sign: 1 | -1): void {
    this.changes.touched();
    this.views.cooling(e, target, sign);
  }
}
