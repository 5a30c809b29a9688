/// <reference lib="dom" />
/**
 * dashboard/web/panels — everything beside the proxies table: the totals in the header, the
 * pools (desired and status counts of each ProxyPool, its conditions), the lease holders,
 * provider health and the list of recent events (newest first).
 */
import { h } from './dom.ts';
import { age, clockTime, timeLeft } from './format.ts';
import type {
  FleetEvent,
  FleetTotals,
  LeaseHolder,
  LeaseHolders,
  PoolSummary,
  ProviderSummary,
} from './types.ts';

/** How many events the page keeps; the server holds a few hundred too. */
export const MAX_EVENTS = 500;

export function renderTotals(el: HTMLElement, t: FleetTotals): void {
  const item = (label: string, value: number, cls = '') =>
    h('span', { class: `total ${cls}` }, h('strong', {}, String(value)), ` ${label}`);
  el.replaceChildren(
    item('proxies', t.proxies),
    item('ready', t.ready),
    item('healthy', t.healthy, t.healthy < t.ready ? 'warn' : ''),
    item('leasable', t.leasable),
    item('leases', t.activeLeases),
    item('cooling down', t.coolingDown),
  );
}

const POOL_COLUMNS = 8;

function poolCount(col: string, n: number | null, warn = false): HTMLElement {
  return h('td', { class: `num${warn ? ' warn' : ''}`, 'data-col': col }, n === null ? '–' : String(n));
}

/** Progressing is work under way, not health: busy while True, neutral once done. */
function conditionTone(type: string, status: string): string {
  if (type === 'Progressing') return status === 'True' ? 'busy' : 'neutral';
  return status.toLowerCase();
}

/** A pool's conditions as chips (type, coloured by status; reason and message on hover). */
function poolStatus(p: PoolSummary): HTMLElement {
  const chips = p.conditions.map((c) =>
    h(
      'span',
      {
        class: `cond cond-${conditionTone(c.type, c.status)}`,
        'data-condition': c.type,
        'data-status': c.status,
        title: [c.reason, c.message].filter(Boolean).join(': '),
      },
      c.type,
    ),
  );
  // Only what needs a person: an unavailable pool or a spec the controller refuses, with why.
  const why = p.conditions
    .filter((c) => c.status === 'False' && (c.type === 'Available' || c.type === 'SpecValid'))
    .map((c) => h('div', { class: 'why' }, `${c.reason ?? c.type}${c.message ? `: ${c.message}` : ''}`));
  const notes = [
    !p.object ? h('span', { class: 'muted' }, `label only, no ProxyPool · ${p.selectors.join(', ')}`) : null,
    p.object && p.stale ? h('span', { class: 'muted' }, 'status catching up') : null,
  ];
  return h('td', { class: 'pool-status' }, ...chips, ...notes, ...why);
}

export function renderPools(table: HTMLTableElement, pools: readonly PoolSummary[]): void {
  const body = table.tBodies[0] ?? table.createTBody();
  if (pools.length === 0) {
    body.replaceChildren(
      h('tr', {}, h('td', { colspan: String(POOL_COLUMNS), class: 'empty' }, 'no pools yet')),
    );
    return;
  }
  body.replaceChildren(
    ...pools.map((p) => {
      const short = p.desired !== null && p.leasable !== null && p.leasable < p.desired;
      return h(
        'tr',
        { 'data-pool': p.key, class: p.deleting ? 'down' : '' },
        h(
          'td',
          {},
          h('span', { class: 'ns' }, `${p.namespace}/`),
          h('span', { title: `selector ${p.selectors.join(' or ')}` }, p.name),
          p.deleting ? h('span', { class: 'muted' }, ' deleting') : null,
        ),
        poolCount('desired', p.desired),
        poolCount('replicas', p.replicas),
        poolCount('ready', p.ready),
        poolCount('healthy', p.healthy, p.healthy !== null && p.ready !== null && p.healthy < p.ready),
        poolCount('leasable', p.leasable, short),
        poolCount('leases', p.activeLeases),
        poolStatus(p),
      );
    }),
  );
}

const LEASE_COLUMNS = 6;

const VIA: Record<NonNullable<LeaseHolder['via']>, string> = {
  api: 'API',
  gateway: 'gateway',
  'gateway-share': 'gateway share',
};

/** "3 live: 2 API, 1 gateway" (origins with none left out). */
function leaseCounts(l: LeaseHolders): string {
  const parts = [
    [l.api, 'API'],
    [l.gateway, 'gateway'],
    [l.gatewayShare, 'gateway share'],
    [l.restored, 'restored'],
  ]
    .filter(([n]) => (n as number) > 0)
    .map(([n, what]) => `${n} ${what}`);
  return `${l.total} live${parts.length ? `: ${parts.join(', ')}` : ''}`;
}

/**
 * The newest live leases: id prefix, proxy, target, origin, age and time left; the server lists
 * a bounded number, the rest are counted.
 */
export function renderLeases(
  table: HTMLTableElement,
  summary: HTMLElement,
  leases: LeaseHolders,
  nowMs: number,
): void {
  summary.textContent =
    leases.more > 0
      ? `${leaseCounts(leases)} · newest ${leases.newest.length} shown, ${leases.more} more`
      : leaseCounts(leases);
  const body = table.tBodies[0] ?? table.createTBody();
  if (leases.newest.length === 0) {
    body.replaceChildren(
      h('tr', {}, h('td', { colspan: String(LEASE_COLUMNS), class: 'empty' }, 'no live leases')),
    );
    return;
  }
  body.replaceChildren(
    ...leases.newest.map((l) =>
      h(
        'tr',
        { 'data-lease': l.id, 'data-via': l.via ?? 'restored' },
        h(
          'td',
          { class: 'mono', 'data-col': 'id', title: 'the first characters of the lease id' },
          `${l.id}…`,
        ),
        h('td', { 'data-col': 'proxy' }, l.proxy),
        h('td', { 'data-col': 'target' }, l.target ?? '–'),
        h('td', { 'data-col': 'via' }, l.via ? VIA[l.via] : 'restored'),
        h('td', { class: 'num', 'data-col': 'age' }, l.grantedAt ? age(Date.parse(l.grantedAt), nowMs) : '–'),
        h('td', { class: 'num', 'data-col': 'left' }, timeLeft(Date.parse(l.expiresAt), nowMs)),
      ),
    ),
  );
}

export function renderProviders(el: HTMLElement, providers: readonly ProviderSummary[]): void {
  if (providers.length === 0) {
    el.replaceChildren(h('p', { class: 'empty' }, 'no provider checked yet'));
    return;
  }
  el.replaceChildren(
    ...providers.map((p) => {
      const state = p.ready === null ? 'unknown' : p.ready ? 'healthy' : 'unhealthy';
      return h(
        'div',
        { class: 'provider', 'data-provider': p.name, 'data-ready': String(p.ready ?? 'unknown') },
        h(
          'div',
          { class: 'provider-head' },
          h('span', { class: `dot ${state}`, title: state }),
          h('strong', {}, p.name),
          ` ${p.type ?? ''} · ${p.targetsReady ?? '–'} targets ready`,
          // Why it is not ready (or not known to be), in the Ready condition's own words.
          p.ready !== true && p.reason ? h('span', { class: 'reason' }, ` · ${p.reason}`) : null,
          p.lastCheckTime ? h('span', { class: 'muted' }, ` · checked ${clockTime(p.lastCheckTime)}`) : null,
        ),
        h(
          'ul',
          {},
          ...p.targets.map((t) =>
            h(
              'li',
              {},
              h('span', { class: `dot ${t.ready ? 'healthy' : 'unhealthy'}` }),
              `${t.name}: ${t.reason}`,
              t.latencyMillis !== null ? ` (${t.latencyMillis} ms)` : '',
              t.message && !t.ready ? h('div', { class: 'why' }, t.message) : null,
            ),
          ),
        ),
      );
    }),
  );
}

/** Appends `fresh` to `kept` (both oldest first) and keeps the newest MAX_EVENTS. */
export function mergeEvents(kept: readonly FleetEvent[], fresh: readonly FleetEvent[]): FleetEvent[] {
  const all = [...kept, ...fresh];
  return all.length > MAX_EVENTS ? all.slice(-MAX_EVENTS) : all;
}

function eventItem(e: FleetEvent): HTMLLIElement {
  return h(
    'li',
    { class: `event event-${e.kind}`, 'data-kind': e.kind },
    h('time', { datetime: e.at }, clockTime(e.at)),
    h('span', { class: 'kind' }, e.kind),
    e.proxy ? h('span', { class: 'proxy' }, e.proxy) : null,
    h('span', { class: 'message' }, e.message),
  );
}

/** Every event anew, newest first. */
export function renderEvents(list: HTMLOListElement, events: readonly FleetEvent[]): void {
  list.replaceChildren(...events.slice().reverse().map(eventItem));
}

/** New events on top of those shown (the older ones stay as they are), the oldest beyond MAX_EVENTS dropped. */
export function prependEvents(list: HTMLOListElement, fresh: readonly FleetEvent[]): void {
  if (fresh.length === 0) return;
  list.prepend(...fresh.slice(-MAX_EVENTS).reverse().map(eventItem));
  while (list.childElementCount > MAX_EVENTS) list.lastElementChild?.remove();
}
