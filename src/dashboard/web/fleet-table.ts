/// <reference lib="dom" />
/**
 * dashboard/web/fleet-table — the proxies table: one row per proxy with health, the latency
 * sparkline, leases and cooldowns with time left (and, for one taken on through a shared egress
 * address, the proxy that was reported); sorted by the clicked column (again for the other
 * direction) and filtered by the words typed.
 */
import { sparkline } from './chart.ts';
import { h } from './dom.ts';
import {
  activeCooldowns,
  matchesQuery,
  type SortColumn,
  type SortOrder,
  sharedNote,
  sortRows,
  timeLeft,
} from './format.ts';
import type { FleetRow, LatencyHistoryBody } from './types.ts';

const NONE = '–';

export class FleetTable {
  private order: SortOrder = { column: 'key', descending: false };
  private query = '';
  private rows: readonly FleetRow[] = [];
  private history: LatencyHistoryBody | undefined;
  private nowMs = 0;
  private readonly table: HTMLTableElement;
  private readonly shown: HTMLElement;

  constructor(table: HTMLTableElement, filter: HTMLInputElement, shown: HTMLElement) {
    this.table = table;
    this.shown = shown;
    for (const th of table.querySelectorAll<HTMLTableCellElement>('th[data-sort]')) {
      const button = th.querySelector('button');
      button?.addEventListener('click', () => this.sortBy(th.dataset.sort as SortColumn));
    }
    filter.addEventListener('input', () => {
      this.query = filter.value;
      this.render();
    });
    this.markSorted();
  }

  update(rows: readonly FleetRow[], nowMs: number): void {
    this.rows = rows;
    this.nowMs = nowMs;
    this.render();
  }

  setHistory(history: LatencyHistoryBody): void {
    this.history = history;
    this.render();
  }

  private sortBy(column: SortColumn): void {
    this.order = { column, descending: this.order.column === column ? !this.order.descending : false };
    this.markSorted();
    this.render();
  }

  private markSorted(): void {
    for (const th of this.table.querySelectorAll<HTMLTableCellElement>('th[data-sort]')) {
      if (th.dataset.sort === this.order.column)
        th.setAttribute('aria-sort', this.order.descending ? 'descending' : 'ascending');
      else th.removeAttribute('aria-sort');
    }
  }

  private render(): void {
    const visible = sortRows(
      this.rows.filter((r) => matchesQuery(r, this.query)),
      this.order,
      this.nowMs,
    );
    const body = this.table.tBodies[0] ?? this.table.createTBody();
    body.replaceChildren(...visible.map((r) => this.row(r)));
    this.shown.textContent =
      visible.length === this.rows.length
        ? `${this.rows.length} proxies`
        : `${visible.length} of ${this.rows.length}`;
  }

  private row(r: FleetRow): HTMLTableRowElement {
    const tr = h('tr', { 'data-proxy': r.key, class: r.healthy ? '' : 'down' });
    tr.append(
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
    );
    return tr;
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
