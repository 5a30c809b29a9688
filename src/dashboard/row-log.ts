/**
 * dashboard/row-log — the proxies table as the state route sends it: each row's JSON with the
 * revision it last changed at, and the keys removed during the recent revisions. A viewer that
 * holds revision R is sent only the rows that changed after R (an idle fleet sends next to
 * nothing, whatever its size); a first load, or a viewer too far behind, reads the fleet in
 * pages ordered by key. Rows are compared as their JSON text, which is also what is sent, so a
 * row is serialised once per sample however many viewers ask.
 */

/** Revisions whose removals are remembered: a viewer further behind loads the fleet afresh. */
export const DEFAULT_REVISIONS_KEPT = 600;

interface Entry {
  json: string;
  /** The revision it last changed at. */
  rev: number;
  /** The revision of the last sample that had it. */
  seen: number;
}

/** Part of an answer as JSON text: the rows and the removed keys. */
export interface RowsJson {
  proxies: string;
  removed: string;
  /** A full answer cut short: the key to continue after (`from`), else null. */
  next: string | null;
  full: boolean;
  /** The number of rows in `proxies`. */
  count: number;
}

export class RowLog {
  private readonly entries = new Map<string, Entry>();
  /** Every key, sorted (the order of the rows given to `apply`). */
  private keys: string[] = [];
  private removals: { key: string; rev: number }[] = [];
  private rev: number;
  /** The oldest revision a delta can still be answered from. */
  private oldest: number;
  private readonly kept: number;
  private readonly deltas = new Map<number, RowsJson>();

  /**
   * `start` is the first revision. Starting from the clock's milliseconds keeps a new process's
   * revisions above an old one's (a sample is at most one per half second), so a page that
   * outlives a restart or a change of leader asks for something this log never had and loads afresh.
   */
  constructor(start: number, kept = DEFAULT_REVISIONS_KEPT) {
    if (!Number.isSafeInteger(start) || start < 0) throw new Error('row log start must be a safe integer');
    if (!Number.isInteger(kept) || kept < 1) throw new Error('revisions kept must be a positive integer');
    this.rev = start;
    this.oldest = start;
    this.kept = kept;
  }

  get revision(): number {
    return this.rev;
  }

  get size(): number {
    return this.entries.size;
  }

  /** One sample's rows, sorted by key: a new revision with what changed since the last one. */
  apply(rows: readonly { key: string }[]): void {
    const rev = ++this.rev;
    const keys = new Array<string>(rows.length);
    for (let i = 0; i < rows.length; i++) {
      const row = rows[i] as { key: string };
      const json = JSON.stringify(row);
      const e = this.entries.get(row.key);
      if (!e) this.entries.set(row.key, { json, rev, seen: rev });
      else {
        if (e.json !== json) {
          e.json = json;
          e.rev = rev;
        }
        e.seen = rev;
      }
      keys[i] = row.key;
    }
    if (this.entries.size > rows.length) {
      for (const [key, e] of this.entries) {
        if (e.seen === rev) continue;
        this.entries.delete(key);
        this.removals.push({ key, rev });
      }
    }
    this.keys = keys;
    this.oldest = Math.max(this.oldest, rev - this.kept);
    if (this.removals.length > 0 && (this.removals[0] as { rev: number }).rev <= this.oldest)
      this.removals = this.removals.filter((r) => r.rev > this.oldest);
    this.deltas.clear();
  }

  /** What changed after revision `since`; undefined when this log cannot tell (too old, or not its own). */
  since(since: number): RowsJson | undefined {
    if (since < this.oldest || since > this.rev) return undefined;
    const cached = this.deltas.get(since);
    if (cached) return cached;
    const changed: string[] = [];
    // Map order is insertion order, not key order: the page orders rows itself.
    for (const e of this.entries.values()) if (e.rev > since) changed.push(e.json);
    const removed: string[] = [];
    for (const r of this.removals) if (r.rev > since) removed.push(r.key);
    const out: RowsJson = {
      proxies: `[${changed.join(',')}]`,
      removed: JSON.stringify(removed),
      next: null,
      full: false,
      count: changed.length,
    };
    this.deltas.set(since, out);
    return out;
  }

  /** Up to `limit` rows in key order, starting after the key `from` (from the first without it). */
  page(from: string | undefined, limit = Number.POSITIVE_INFINITY): RowsJson {
    let start = 0;
    if (from !== undefined) {
      let lo = 0;
      let hi = this.keys.length;
      while (lo < hi) {
        const mid = (lo + hi) >>> 1;
        if ((this.keys[mid] as string) <= from) lo = mid + 1;
        else hi = mid;
      }
      start = lo;
    }
    const end = Math.min(this.keys.length, start + limit);
    const rows: string[] = [];
    for (let i = start; i < end; i++) rows.push((this.entries.get(this.keys[i] as string) as Entry).json);
    return {
      proxies: `[${rows.join(',')}]`,
      removed: '[]',
      next: end < this.keys.length && end > start ? (this.keys[end - 1] as string) : null,
      full: true,
      count: rows.length,
    };
  }
}
