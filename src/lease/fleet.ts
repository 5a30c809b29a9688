/**
 * lease/fleet — the proxies the lease store knows, as the lease feed and the health engine
 * describe them, plus the ones a checkpoint named that the feed has not delivered yet (held
 * aside, adopted when the same uid arrives). Every change to a proxy goes through the selection
 * (lease/selection), so its views never lag behind.
 */
import { selectableLabels } from '../api/location.ts';
import { proxyUrlWithCredentials } from '../api/url.ts';
import type { Clock } from '../runtime/clock.ts';
import type { Selector } from '../runtime/selector.ts';
import type { Cooldowns } from './cooldowns.ts';
import { type Entry, newEntry, snapshotOf } from './entry.ts';
import { SortedList } from './ordered.ts';
import type { Selection } from './selection.ts';
import type { ProxyInfo, ProxySnapshot } from './types.ts';
import { matchesFilter } from './view.ts';

export class Fleet {
  private readonly selection: Selection;
  private readonly cooldowns: Cooldowns;
  private readonly clock: Clock;
  private readonly byKey = new Map<string, Entry>();
  /** The same entries by namespace and name: a listing (or one page of it) walks no more than it returns. */
  private readonly byName = new SortedList<Entry>(byNamespaceAndName);
  /** Entries restored from a checkpoint whose Proxy the feed has not delivered yet. */
  private readonly heldAside = new Map<string, Entry>();

  constructor(selection: Selection, cooldowns: Cooldowns, clock: Clock) {
    this.selection = selection;
    this.cooldowns = cooldowns;
    this.clock = clock;
  }

  get(key: string): Entry | undefined {
    return this.byKey.get(key);
  }

  /** Every proxy in the fleet (not those held aside). */
  all(): IterableIterator<Entry> {
    return this.byKey.values();
  }

  /** Entries restored from a checkpoint and not adopted yet. */
  held(): IterableIterator<Entry> {
    return this.heldAside.values();
  }

  upsert(info: ProxyInfo): void {
    let existing = this.byKey.get(info.key);
    if (!existing) existing = this.adoptHeld(info.key, info.uid);
    if (existing && existing.uid === info.uid) {
      const e = existing;
      this.selection.update(e, () => this.assign(e, info));
      return;
    }
    if (existing) this.detach(existing);
    const e = newEntry(info);
    this.assign(e, info);
    this.byKey.set(info.key, e);
    this.byName.insert(e);
    this.selection.update(e, () => {});
  }

  /** Forgets a proxy: no new leases; existing leases stay valid until released or expired. */
  remove(key: string): void {
    const e = this.byKey.get(key);
    if (e) this.detach(e);
  }

  /**
   * A health verdict (and optionally the latest probe latency). From the first call on, verdicts
   * win over the Healthy condition the feed passes in, which may lag behind. A stale uid (the
   * object was recreated under the same name) is ignored; returns whether it applied.
   */
  setHealth(
    key: string,
    uid: string | undefined,
    health: { healthy: boolean; latencyMillis?: number },
  ): boolean {
    const e = this.byKey.get(key);
    if (!e || (uid !== undefined && uid !== '' && e.uid !== uid)) return false;
    if (
      e.healthFromVerdict &&
      e.healthy === health.healthy &&
      (health.latencyMillis === undefined || health.latencyMillis === e.latencyMillis)
    ) {
      return true;
    }
    this.selection.update(e, () => {
      e.healthy = health.healthy;
      e.healthFromVerdict = true;
      if (health.latencyMillis !== undefined) e.latencyMillis = health.latencyMillis;
    });
    return true;
  }

  /** Live leases of proxy `key` granted while it served from `instance` (a drain waits for them). */
  leasesOn(key: string, instance: string): number {
    return this.byKey.get(key)?.activeByInstance.get(instance) ?? 0;
  }

  /**
   * The public view of the proxies matching the filter, by namespace and name: all of them, or
   * at most `limit` starting after `after` (a `namespace/name`) and whether more follow.
   */
  snapshot(
    namespace: string | undefined,
    selector: Selector | undefined,
    target: string | undefined,
    now: number,
    page: { limit?: number; after?: string } = {},
  ): { proxies: ProxySnapshot[]; more: boolean } {
    const out: ProxySnapshot[] = [];
    const limit = page.limit ?? Number.POSITIVE_INFINITY;
    let entries: Iterable<Entry> = this.byName;
    if (page.after !== undefined) {
      const slash = page.after.indexOf('/');
      const probe = { namespace: page.after.slice(0, slash), name: page.after.slice(slash + 1) } as Entry;
      entries = this.byName.after(probe);
    } else if (namespace !== undefined) {
      // The namespace's first proxy sorts right after its name with nothing behind it.
      entries = this.byName.after({ namespace, name: '' } as Entry);
    }
    for (const e of entries) {
      if (namespace !== undefined && e.namespace !== namespace) {
        if (e.namespace > namespace) break;
        continue;
      }
      if (!matchesFilter(e, namespace, selector)) continue;
      if (out.length >= limit) return { proxies: out, more: true };
      out.push(snapshotOf(e, target, now));
    }
    return { proxies: out, more: false };
  }

  /**
   * The entry a checkpoint record belongs to: the live one with that uid, or one held aside
   * (made now if need be); undefined when the live proxy of that name is another object.
   */
  entryForRecord(key: string, uid: string): Entry | undefined {
    const live = this.byKey.get(key);
    if (live) return live.uid === uid ? live : undefined;
    const held = this.heldAside.get(key);
    if (held) return held.uid === uid ? held : undefined;
    const slash = key.indexOf('/');
    const e = newEntry({ key, namespace: key.slice(0, slash), name: key.slice(slash + 1), uid });
    this.heldAside.set(key, e);
    return e;
  }

  /** A held-aside entry for `key`, moved into the fleet when the feed delivers the same uid. */
  private adoptHeld(key: string, uid: string): Entry | undefined {
    const held = this.heldAside.get(key);
    if (!held) return undefined;
    this.heldAside.delete(key);
    if (held.uid !== uid) return undefined;
    this.byKey.set(key, held);
    this.byName.insert(held);
    return held;
  }

  private assign(e: Entry, info: ProxyInfo): void {
    e.labels = { ...info.labels };
    e.location = info.location ? { ...info.location } : undefined;
    e.selectable = selectableLabels(e.labels, e.location);
    e.phase = info.phase;
    if (!e.healthFromVerdict) {
      e.healthy = info.healthy;
      if (info.latencyMillis !== undefined) e.latencyMillis = info.latencyMillis;
    }
    if (info.draining && !e.draining && e.drainingSince === 0) e.drainingSince = this.clock.now();
    if (!info.draining) e.drainingSince = 0;
    e.draining = info.draining;
    e.deleting = info.deleting;
    e.maxLeases = Math.max(0, Math.floor(info.maxLeases));
    e.host = info.host;
    e.port = info.port;
    e.url = info.host ? proxyUrlWithCredentials(info.host, info.port, info.credentials) : '';
    e.problem = info.problem;
    e.instance = info.instance ?? '';
    e.drainingInstances = info.drainingInstances ?? [];
    this.cooldowns.place(e, info.egressIP, this.clock.now());
  }

  private detach(e: Entry): void {
    this.selection.update(e, () => {
      e.removed = true;
    });
    this.cooldowns.leave(e);
    this.byKey.delete(e.key);
    this.byName.delete(e);
  }
}

function byNamespaceAndName(a: Entry, b: Entry): number {
  if (a.namespace !== b.namespace) return a.namespace < b.namespace ? -1 : 1;
  return a.name === b.name ? 0 : a.name < b.name ? -1 : 1;
}
