/**
 * dashboard/web/format — the page's pure logic: time left and ages, how a shared cooldown reads,
 * filtering and sorting the fleet table. No DOM here, so the same code is unit-tested under Node.
 */
import type { FleetRow, TargetCooldownRow } from './types.ts';

export type SortColumn =
  | 'key'
  | 'pool'
  | 'provider'
  | 'phase'
  | 'latency'
  | 'leases'
  | 'cooldowns'
  | 'egressIP'
  | 'address';

export interface SortOrder {
  column: SortColumn;
  descending: boolean;
}

/** Whole seconds as "42 s", "9 min 58 s", "1 h 03 min". */
function duration(s: number): string {
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${String(s % 60).padStart(2, '0')} s`;
  return `${Math.floor(s / 3600)} h ${String(Math.floor((s % 3600) / 60)).padStart(2, '0')} min`;
}

/** "42 s", "9 min 58 s", "1 h 03 min"; "ended" once past. */
export function timeLeft(untilMs: number, nowMs: number): string {
  const s = Math.ceil((untilMs - nowMs) / 1000);
  return s <= 0 ? 'ended' : duration(s);
}

/** How long ago `sinceMs` was, as timeLeft writes it ("0 s" for a clock slightly ahead). */
export function age(sinceMs: number, nowMs: number): string {
  return duration(Math.max(0, Math.floor((nowMs - sinceMs) / 1000)));
}

/** The key of `proxy` as a row of namespace `namespace` names it: the name alone when they share it. */
export function proxyIn(proxy: string, namespace: string): string {
  return proxy.startsWith(`${namespace}/`) ? proxy.slice(namespace.length + 1) : proxy;
}

/** "via 127.0.0.3, blocked on local-2": a cooldown taken on from a proxy on the same address. */
export function sharedNote(from: { proxy: string; address: string }, namespace: string): string {
  return `via ${from.address}, blocked on ${proxyIn(from.proxy, namespace)}`;
}

export interface ActiveCooldown {
  /** null: every target (a `failed` report). */
  target: string | null;
  until: number;
  /** Set when taken on from another proxy on the same egress address. */
  sharedFrom: TargetCooldownRow['sharedFrom'];
}

/** Cooldowns still running at `nowMs`: the global one (target null) first, then per target. */
export function activeCooldowns(row: FleetRow, nowMs: number): ActiveCooldown[] {
  const out: ActiveCooldown[] = [];
  const global = row.cooldownUntil ? Date.parse(row.cooldownUntil) : 0;
  if (global > nowMs) out.push({ target: null, until: global, sharedFrom: null });
  for (const c of row.targetCooldowns) {
    const until = Date.parse(c.until);
    if (until > nowMs) out.push({ target: c.target, until, sharedFrom: c.sharedFrom });
  }
  return out;
}

/** The text the filter searches in a row (lower case). */
export function rowText(row: FleetRow): string {
  return [
    row.key,
    row.pool ?? '',
    row.provider ?? '',
    row.phase,
    row.healthy ? 'healthy' : 'unhealthy',
    row.leasable ? 'leasable' : (row.reason ?? ''),
    row.egressIP ?? '',
    row.address ?? '',
    ...row.targetCooldowns.flatMap((c) =>
      c.sharedFrom ? [c.target, c.sharedFrom.proxy, c.sharedFrom.address] : [c.target],
    ),
  ]
    .join(' ')
    .toLowerCase();
}

/** The words of a filter, lower case. */
export function queryWords(query: string): string[] {
  return query.toLowerCase().split(/\s+/).filter(Boolean);
}

/** Every whitespace-separated word of `query` must occur somewhere in the row (case-insensitive). */
export function matchesQuery(row: FleetRow, query: string): boolean {
  const words = queryWords(query);
  if (words.length === 0) return true;
  const text = rowText(row);
  return words.every((w) => text.includes(w));
}

export interface PageBounds {
  /** The page shown, 0-based: the one asked for, moved back when the rows no longer reach it. */
  page: number;
  pages: number;
  /** Index of its first row, and one past its last. */
  start: number;
  end: number;
}

/** Which rows of `total` page `page` of `size` shows (at least one page, even an empty one). */
export function pageBounds(total: number, page: number, size: number): PageBounds {
  const pages = Math.max(1, Math.ceil(total / size));
  const p = Math.min(Math.max(0, page), pages - 1);
  return { page: p, pages, start: p * size, end: Math.min(total, (p + 1) * size) };
}

function sortKey(row: FleetRow, column: SortColumn, nowMs: number): string | number {
  switch (column) {
    case 'key':
      return row.key;
    case 'pool':
      return row.pool ?? '\uffff';
    case 'provider':
      return row.provider ?? '\uffff';
    case 'phase':
      return row.phase;
    case 'latency':
      // Unhealthy last, whatever its old latency.
      return row.healthy && row.latencyMillis !== null ? row.latencyMillis : Number.MAX_SAFE_INTEGER;
    case 'leases':
      return row.activeLeases;
    case 'cooldowns':
      return activeCooldowns(row, nowMs).length;
    case 'egressIP':
      return row.egressIP ?? '\uffff';
    case 'address':
      return row.address ?? '\uffff';
  }
}

interface Keyed {
  row: FleetRow;
  k: string | number;
}

function comparator(order: SortOrder): (a: Keyed, b: Keyed) => number {
  const sign = order.descending ? -1 : 1;
  return (a, b) => {
    if (a.k < b.k) return -sign;
    if (a.k > b.k) return sign;
    return a.row.key < b.row.key ? -1 : a.row.key > b.row.key ? 1 : 0;
  };
}

/** A sorted copy; ties keep namespace/name order, so rows do not jump between refreshes. */
export function sortRows(rows: readonly FleetRow[], order: SortOrder, nowMs: number): FleetRow[] {
  return rows
    .map((row) => ({ row, k: sortKey(row, order.column, nowMs) }))
    .sort(comparator(order))
    .map((x) => x.row);
}

/**
 * `sorted` (sorted by `order`) without the rows of `touched` keys, with `fresh` rows sorted in:
 * what an update does to a sorted fleet where only some rows changed. The rows that did not
 * change keep their order, so only the changed ones are sorted, then merged in one pass —
 * linear in the fleet instead of sorting all of it. Not for an order that moves with the clock
 * (`cooldowns`): sort that with sortRows.
 */
export function resortRows(
  sorted: readonly FleetRow[],
  touched: ReadonlySet<string>,
  fresh: readonly FleetRow[],
  order: SortOrder,
  nowMs: number,
): FleetRow[] {
  const cmp = comparator(order);
  const added = fresh.map((row) => ({ row, k: sortKey(row, order.column, nowMs) })).sort(cmp);
  const out: FleetRow[] = [];
  let j = 0;
  for (const row of sorted) {
    if (touched.has(row.key)) continue;
    const kept = { row, k: sortKey(row, order.column, nowMs) };
    while (j < added.length && cmp(added[j] as Keyed, kept) < 0) out.push((added[j++] as Keyed).row);
    out.push(row);
  }
  while (j < added.length) out.push((added[j++] as Keyed).row);
  return out;
}

/** The values of a longest strictly increasing subsequence of `xs`. */
export function longestIncreasing(xs: readonly number[]): number[] {
  const tails: number[] = [];
  const tailAt: number[] = [];
  const prev = new Array<number>(xs.length).fill(-1);
  xs.forEach((x, i) => {
    let lo = 0;
    let hi = tails.length;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if ((tails[mid] as number) < x) lo = mid + 1;
      else hi = mid;
    }
    tails[lo] = x;
    tailAt[lo] = i;
    prev[i] = lo > 0 ? (tailAt[lo - 1] as number) : -1;
  });
  const out: number[] = [];
  for (let i = tailAt[tails.length - 1] ?? -1; i >= 0; i = prev[i] as number) out.push(xs[i] as number);
  return out.reverse();
}

/** Local wall-clock time of an RFC 3339 instant, HH:MM:SS. */
export function clockTime(iso: string): string {
  const d = new Date(iso);
  return [d.getHours(), d.getMinutes(), d.getSeconds()].map((n) => String(n).padStart(2, '0')).join(':');
}

/** Min, mean and max of a latency series, ignoring gaps; null when it has no value. */
export function seriesStats(
  values: readonly (number | null)[],
): { min: number; mean: number; max: number } | null {
  let min = Number.POSITIVE_INFINITY;
  let max = Number.NEGATIVE_INFINITY;
  let sum = 0;
  let n = 0;
  for (const v of values) {
    if (v === null) continue;
    min = Math.min(min, v);
    max = Math.max(max, v);
    sum += v;
    n++;
  }
  return n === 0 ? null : { min, mean: sum / n, max };
}
