/**
 * runtime/objects/history — one collection's retained events and live watchers: events are
 * kept up to a limit so a watch can resume from a resourceVersion (410 Gone below the
 * compaction point), and each watcher sees changes through its filter the way the API server
 * shows them (an object entering or leaving a selector is ADDED or DELETED).
 */
import { deepClone } from '../patch.ts';
import { StoreError } from '../store.ts';
import type { EngineEvent, EngineWatch, StoredObject } from './types.ts';

export interface Watcher {
  match: (obj: StoredObject) => boolean;
  handler: (ev: EngineEvent) => void;
}

export class EventHistory {
  private readonly limit: number;
  private events: EngineEvent[] = [];
  private compactedRv = 0;
  private readonly watchers = new Set<Watcher>();

  constructor(limit: number) {
    this.limit = limit;
  }

  /** Lowest resourceVersion a watch can still resume from. */
  get compactedResourceVersion(): number {
    return this.compactedRv;
  }

  /** Retains `ev` (dropping the oldest beyond the limit) and delivers it to the watchers. */
  record(ev: EngineEvent): void {
    this.events.push(ev);
    if (this.events.length > this.limit) {
      const dropped = this.events.splice(0, this.events.length - this.limit);
      this.compactedRv = (dropped[dropped.length - 1] as EngineEvent).rv;
    }
    for (const w of this.watchers) deliver(w, ev);
  }

  /** Adds `w`: it sees every change from now on. */
  follow(w: Watcher): EngineWatch {
    this.watchers.add(w);
    return { stop: () => this.watchers.delete(w) };
  }

  /** Replays the retained events after version `from` to `w`, then follows; Gone when compacted. */
  resume(w: Watcher, from: string): EngineWatch {
    const n = Number(from);
    if (!Number.isInteger(n) || n < 0) {
      throw new StoreError('BadRequest', 400, `invalid resourceVersion ${JSON.stringify(from)}`);
    }
    if (n < this.compactedRv) {
      throw new StoreError('Gone', 410, `too old resource version: ${n} (${this.compactedRv})`);
    }
    for (const ev of this.events) if (ev.rv > n) deliver(w, ev);
    return this.follow(w);
  }

  compactTo(rv: number): void {
    this.events = this.events.filter((e) => e.rv > rv);
    this.compactedRv = Math.max(this.compactedRv, rv);
  }

  /** Forgets every event: versions up to `rv` read as compacted. */
  reset(rv: number): void {
    this.events = [];
    this.compactedRv = rv;
  }
}

/**
 * Applies the watcher's filter, turning selector transitions into ADDED / DELETED like the
 * apiserver (which shows an object leaving the selector as it was when it still matched).
 */
function deliver(w: Watcher, ev: EngineEvent): void {
  const now = w.match(ev.object);
  let out: EngineEvent | undefined;
  if (ev.type === 'MODIFIED') {
    const before = ev.old ? w.match(ev.old) : false;
    if (now && before) out = ev;
    else if (now) out = { ...ev, type: 'ADDED' };
    else if (before && ev.old) {
      // The state the watcher last matched, at the version of the change that took it out.
      const last = deepClone(ev.old);
      last.metadata.resourceVersion = ev.object.metadata.resourceVersion;
      out = { ...ev, type: 'DELETED', object: last };
    }
  } else if (now) {
    out = ev;
  }
  if (!out) return;
  try {
    w.handler({ ...out, object: deepClone(out.object), old: out.old && deepClone(out.old) });
  } catch {
    // A watcher's failure must never break a commit; watchers log their own errors.
  }
}
