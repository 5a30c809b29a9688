/// <reference lib="dom" />
/**
 * dashboard/web/fleet-table — the proxies table: one row per proxy with health, the latency
 * sparkline, leases and cooldowns with time left (and, for one taken on through a shared egress
 * address, the proxy that was reported); sorted by the clicked column (again for the other
 * direction) and filtered by the words typed, over the whole fleet. It shows one page of rows,
 * so the DOM stays the same size at 10 or 10,000 proxies, and keeps each row's element by key:
 * an update redraws only the rows that changed (and the time left of running cooldowns).
 */
import { sparkline } from './chart.ts';
import { h } from './dom.ts';
import {
  activeCooldowns,
  longestIncreasing,
  pageBounds,
  queryWords,
  resortRows,
  rowText,
  type SortColumn,
  type SortOrder,
  sharedNote,
  sortRows,
  timeLeft,
} from './format.ts';
import type { FleetRow, LatencyHistoryBody } from './types.ts';

const NONE = '–';
/** Rows on one page: the most the table ever holds in the DOM. */
export const PAGE_ROWS = 50;
/** The indexes of the health and cooldowns cells in a row. */
const HEALTH_CELL = 4;
const COOLDOWN_CELL = 6;

export interface FleetTableElements {
  table: HTMLTableElement;
  filter: HTMLInputElement;
  /** "12 proxies", "3 of 12". */
  shown: HTMLElement;
  prev: HTMLButtonElement;
  next: HTMLButtonElement;
  /** "1–100 of 10000". */
  pageInfo: HTMLElement;
}

interface Drawn {
  tr: HTMLTableRowElement;
  /** The row object it was drawn from (a changed row arrives as a new object). */
  row: FleetRow;
  /** The history it was drawn with. */
  history: LatencyHistoryBody | undefined;
}

export class FleetTable {
  private order: SortOrder = { column: 'key', descending: false };
  private words: string[] = [];
  private readonly rows = new Map<string, FleetRow>();
  /** The keys the filter keeps, in the sort order; recomputed only when that can change. */
  private visible: string[] = [];
  private visibleStale = true;
  private page = 0;
  /** The `<tr>` of each row on the page, by key. */
  private readonly drawn = new Map<string, Drawn>();
  /** The filter's text of each row, computed once per row object. */
  private readonly texts = new WeakMap<FleetRow, string>();
  private history: LatencyHistoryBody | undefined;
  private nowMs = 0;
  private readonly el: FleetTableElements;
  private readonly body: HTMLTableSectionElement;
  /** Called when a person changes which rows are shown (page, filter, sort). */
  onShownChange: () => void = () => {};

  constructor(el: FleetTableElements) {
    this.el = el;
    this.body = el.table.tBodies[0] ?? el.table.createTBody();
    for (const th of el.table.querySelectorAll<HTMLTableCellElement>('th[data-sort]')) {
      const button = th.querySelector('button');
      button?.addEventListener('click', () => this.sortBy(th.dataset.sort as SortColumn));
    }
    el.filter.addEventListener('input', () => {
      this.words = queryWords(el.filter.value);
      this.page = 0;
      this.visibleStale = true;
      this.shownChanged();
    });
    el.prev.addEventListener('click', () => this.turn(-1));
    el.next.addEventListener('click', () => this.turn(1));
    this.markSorted();
  }

  /** Every row anew (a full answer). */
  replace(rows: readonly FleetRow[], nowMs: number): void {
    this.rows.clear();
    for (const r of rows) this.rows.set(r.key, r);
    this.visibleStale = true;
    this.nowMs = nowMs;
    this.render();
  }

  /** The rows that changed and the keys that went (a delta answer). */
  apply(changed: readonly FleetRow[], removed: readonly string[], nowMs: number): void {
    this.nowMs = nowMs;
    const touched = new Set<string>(removed);
    for (const key of removed) this.rows.delete(key);
    for (const r of changed) {
      touched.add(r.key);
      this.rows.set(r.key, r);
    }
    // Time left is counted against the server's clock: sorting by cooldowns moves with it.
    if (this.order.column === 'cooldowns') this.visibleStale = true;
    if (!this.visibleStale && touched.size > 0) {
      const sorted: FleetRow[] = [];
      for (const key of this.visible) {
        const r = this.rows.get(key);
        // A removed row is skipped by `touched`; its old object would do as well.
        if (r) sorted.push(r);
      }
      const fresh = changed.filter((r) => this.matches(r));
      this.visible = resortRows(sorted, touched, fresh, this.order, nowMs).map((r) => r.key);
    }
    this.render();
  }

  setHistory(history: LatencyHistoryBody): void {
    this.history = history;
    this.render();
  }

  /** The keys of the rows on the page (their latency history is what the page asks for). */
  shownKeys(): string[] {
    return [...this.drawn.keys()];
  }

  private turn(by: number): void {
    this.page += by;
    this.shownChanged();
  }

  private shownChanged(): void {
    this.render();
    this.onShownChange();
  }

  private sortBy(column: SortColumn): void {
    this.order = { column, descending: this.order.column === column ? !this.order.descending : false };
    this.page = 0;
    this.visibleStale = true;
    this.markSorted();
    this.shownChanged();
  }

  private markSorted(): void {
    for (const th of this.el.table.querySelectorAll<HTMLTableCellElement>('th[data-sort]')) {
      if (th.dataset.sort === this.order.column)
        th.setAttribute('aria-sort', this.order.descending ? 'descending' : 'ascending');
      else th.removeAttribute('aria-sort');
    }
  }

  private text(r: FleetRow): string {
    let t = this.texts.get(r);
    if (t === undefined) {
      t = rowText(r);
      this.texts.set(r, t);
    }
    return t;
  }

  private matches(r: FleetRow): boolean {
    return this.words.length === 0 || this.words.every((w) => this.text(r).includes(w));
  }

  private computeVisible(): void {
    const kept: FleetRow[] = [];
    for (const r of this.rows.values()) if (this.matches(r)) kept.push(r);
    this.visible = sortRows(kept, this.order, this.nowMs).map((r) => r.key);
    this.visibleStale = false;
  }

  private render(): void {
    if (this.visibleStale) this.computeVisible();
    const b = pageBounds(this.visible.length, this.page, PAGE_ROWS);
    this.page = b.page;
    const trs: HTMLTableRowElement[] = [];
    const keep = new Set<string>();
    for (let i = b.start; i < b.end; i++) {
      const key = this.visible[i] as string;
      const r = this.rows.get(key) as FleetRow;
      keep.add(key);
      const d = this.drawn.get(key);
      if (!d) {
        const tr = h('tr', { 'data-proxy': key });
        this.fill(tr, r);
        this.drawn.set(key, { tr, row: r, history: this.history });
        trs.push(tr);
        continue;
      }
      if (d.row !== r) {
        this.fill(d.tr, r);
        d.row = r;
        d.history = this.history;
      } else if (d.history !== this.history) {
        // New charts: only the health cell changes.
        d.tr.cells[HEALTH_CELL]?.replaceWith(this.healthCell(r));
        d.history = this.history;
      } else if (r.cooldownUntil !== null || r.targetCooldowns.length > 0) {
        // Unchanged, but its time left runs down.
        d.tr.cells[COOLDOWN_CELL]?.replaceWith(this.cooldownCell(r));
      }
      trs.push(d.tr);
    }
    for (const key of this.drawn.keys()) if (!keep.has(key)) this.drawn.delete(key);
    place(this.body, trs);
    const total = this.rows.size;
    const n = this.visible.length;
    this.el.shown.textContent = n === total ? `${total} proxies` : `${n} of ${total}`;
    this.el.pageInfo.textContent = n === 0 ? '' : `${b.start + 1}–${b.end} of ${n}`;
    this.el.prev.disabled = b.page === 0;
    this.el.next.disabled = b.page >= b.pages - 1;
  }

  /** Redraws a row's cells in its element (which keeps its place and identity). */
  private fill(tr: HTMLTableRowElement, r: FleetRow): void {
    tr.className = r.healthy ? '' : 'down';
    tr.replaceChildren(...this.cells(r));
  }

  private cells(r: FleetRow): HTMLTableCellElement[] {
    return [
      h('td', {}, h('span', { class: 'ns' }, `${r.namespace}/`), h('strong', {}, r.name)),
      h('td', r.pool ? { title: `${r.poolLabel}=${r.pool}` } : {}, r.pool ?? NONE),
      h('td', {}, r.provider ?? NONE),
      h(
        'td',
        {},
        h('span', { class: `phase phase-${r.phase.toLowerCase()}` }, r.phase),
        r.draining ? ' draining' : '',
      ),
      this.healthCell(r),
      h(
        'td',
        { class: 'num' },
        r.maxLeases > 0 ? `${r.activeLeases}/${r.maxLeases}` : String(r.activeLeases),
      ),
      this.cooldownCell(r),
      h('td', { class: 'mono' }, r.egressIP ?? NONE),
      h('td', { class: 'mono' }, r.address ?? NONE),
    ];
  }

  private healthCell(r: FleetRow): HTMLTableCellElement {
    const state = r.healthy ? 'healthy' : 'unhealthy';
    const latency = r.healthy && r.latencyMillis !== null ? `${Math.round(r.latencyMillis)} ms` : '';
    const why = r.leasable ? '' : (r.problem ?? r.reason ?? '');
    const series = this.history?.series[r.key];
    return h(
      'td',
      { class: 'health' },
      h('span', { class: `dot ${state}`, title: state }),
      h('span', { class: 'latency' }, latency || state),
      series && this.history ? sparkline(series, this.history.stepSeconds) : null,
      why ? h('div', { class: 'why' }, why) : null,
    );
  }

  private cooldownCell(r: FleetRow): HTMLTableCellElement {
    const active = activeCooldowns(r, this.nowMs);
    if (active.length === 0) return h('td', { class: 'cooldowns' }, NONE);
    return h(
      'td',
      { class: 'cooldowns' },
      h(
        'ul',
        {},
        ...active.map((c) =>
          h(
            'li',
            {
              'data-target': c.target ?? '*',
              ...(c.sharedFrom ? { 'data-shared-from': c.sharedFrom.proxy } : {}),
            },
            h('span', { class: 'target' }, c.target ?? 'all targets'),
            ' ',
            h('span', { class: 'left' }, timeLeft(c.until, this.nowMs)),
            // Not this proxy's block: a site blocked the address it shares with the reported proxy.
            c.sharedFrom ? h('div', { class: 'shared' }, sharedNote(c.sharedFrom, r.namespace)) : null,
          ),
        ),
      ),
    );
  }
}

/**
 * Puts `wanted` in `body` in that order, moving as few rows as it can: the rows that leave go
 * first, then the longest run of rows already in order stays put and only the others move.
 * (Every row the DOM moves is styled and laid out again.)
 */
function place(body: HTMLTableSectionElement, wanted: readonly HTMLTableRowElement[]): void {
  const at = new Map<HTMLTableRowElement, number>();
  for (let i = 0; i < wanted.length; i++) at.set(wanted[i] as HTMLTableRowElement, i);
  for (const tr of [...body.rows]) if (!at.has(tr)) tr.remove();
  const stay = new Set(longestIncreasing([...body.rows].map((tr) => at.get(tr) as number)));
  for (let i = wanted.length - 1; i >= 0; i--) {
    const tr = wanted[i] as HTMLTableRowElement;
    if (stay.has(i)) continue;
    body.insertBefore(tr, wanted[i + 1] ?? null);
  }
}
