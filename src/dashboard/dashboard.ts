/**
 * dashboard/dashboard — the server side of the dashboard (docs/dashboard.md): samples the lease
 * store and the object store on a timer (and when a viewer asks for a fresher picture), turns
 * the differences into events, keeps the latency history, and caches the JSON it serves, so
 * any number of viewers cost one snapshot per refresh and the lease API's paths do no extra work.
 */
import type { ProxyObject } from '../api/proxy.ts';
import type { LeaseStore } from '../lease/store.ts';
import type { Clock, TimerHandle } from '../runtime/clock.ts';
import type { ObjectStore } from '../runtime/store.ts';
import { DEFAULT_EVENT_CAPACITY, EventRing } from './events.ts';
import { fleetRows, fleetTotals } from './fleet.ts';
import { DEFAULT_HISTORY_STEP_MS, DEFAULT_HISTORY_STEPS, LatencyHistory } from './history.ts';
import { leaseHolders, MAX_LEASE_HOLDERS } from './lease-holders.ts';
import { objectEvents } from './object-events.ts';
import { type PoolLister, poolEvents, storePools } from './pools.ts';
import { providerSummaries } from './providers.ts';
import { RowLog } from './row-log.ts';
import { type DerivedEvent, fleetEvents, type Observed } from './snapshot-events.ts';
import type { DashboardState } from './web/types.ts';

/** `GET /v1/dashboard/state`'s query beside `after` (dashboard/schemas). */
export interface StateQuery {
  /** The revision the viewer holds: only rows changed after it are sent. */
  since?: number | undefined;
  /** Continue a full load after this key. */
  from?: string | undefined;
  /** At most this many rows in a full answer. */
  limit?: number | undefined;
}

export interface DashboardOptions {
  leases: Pick<LeaseStore, 'snapshot' | 'liveLeases' | 'cooldownOrigins'>;
  store: Pick<ObjectStore, 'proxies' | 'proxyPools' | 'providerHealths'>;
  clock: Clock;
  /** Sampling period while nobody looks (events and history keep coming); default 5 s. */
  idleSampleMs?: number;
  /** A viewer's request re-samples when the last sample is older than this; default 500 ms. */
  freshMs?: number;
  historyStepMs?: number;
  historySteps?: number;
  eventCapacity?: number;
  /** Where the pools come from; default: the store's ProxyPool objects (dashboard/pools). */
  pools?: PoolLister;
}

export const DEFAULT_IDLE_SAMPLE_MS = 5000;
export const DEFAULT_FRESH_MS = 500;

export class Dashboard {
  private readonly o: Required<Omit<DashboardOptions, 'leases' | 'store' | 'clock'>>;
  private readonly events: EventRing;
  private readonly history: LatencyHistory;
  private observed = new Map<string, Observed>();
  private sampledAt = Number.NEGATIVE_INFINITY;
  /** The state without its rows and events: `{…}` minus the closing brace, so they can be appended. */
  private headJson = '';
  private readonly rows: RowLog;
  /**
   * The Proxy cache's list as of the last sample, kept while the watch reports no change (a
   * sorted list of 10,000 objects is a third of a sample's cost); only trusted while watching.
   */
  private proxies: ProxyObject[] | undefined;
  private watching = false;
  private historyJson: { at: number; json: string } | undefined;

  private readonly deps: DashboardOptions;

  constructor(deps: DashboardOptions) {
    this.deps = deps;
    this.o = {
      idleSampleMs: deps.idleSampleMs ?? DEFAULT_IDLE_SAMPLE_MS,
      freshMs: deps.freshMs ?? DEFAULT_FRESH_MS,
      historyStepMs: deps.historyStepMs ?? DEFAULT_HISTORY_STEP_MS,
      historySteps: deps.historySteps ?? DEFAULT_HISTORY_STEPS,
      eventCapacity: deps.eventCapacity ?? DEFAULT_EVENT_CAPACITY,
      pools: deps.pools ?? storePools(deps.store),
    };
    this.events = new EventRing(this.o.eventCapacity);
    this.history = new LatencyHistory(this.o.historyStepMs, this.o.historySteps);
    this.rows = new RowLog(Math.max(0, Math.floor(deps.clock.now())));
  }

  /** Watches the Proxies and ProxyPools and samples every idle period until `signal` aborts. */
  async run(signal: AbortSignal): Promise<void> {
    const { clock } = this.deps;
    const unsubscribe = this.deps.store.proxies.watch((e) => {
      this.proxies = undefined;
      this.addAll(objectEvents(e));
    });
    this.watching = true;
    const unsubscribePools = this.deps.store.proxyPools.watch((e) => this.addAll(poolEvents(e)));
    let timer: TimerHandle | undefined;
    const loop = () => {
      this.sample();
      timer = clock.setTimeout(loop, this.o.idleSampleMs);
    };
    try {
      loop();
      await new Promise<void>((done) => {
        if (signal.aborted) done();
        else signal.addEventListener('abort', () => done(), { once: true });
      });
    } finally {
      if (timer) clock.clearTimeout(timer);
      this.watching = false;
      unsubscribe();
      unsubscribePools();
    }
  }

  /**
   * `GET /v1/dashboard/state` as JSON text: the totals and panels now, the rows changed after
   * revision `since` (or, without one it can answer, the fleet from `from`, at most `limit`
   * rows) and the events after `after`.
   */
  stateJson(after: number, query: StateQuery = {}): string {
    this.refresh();
    const rows =
      (query.since !== undefined && query.from === undefined ? this.rows.since(query.since) : undefined) ??
      this.rows.page(query.from, query.limit);
    const events = this.events.since(after);
    return `${this.headJson},"revision":${this.rows.revision},"full":${rows.full},"proxies":${rows.proxies},"removed":${rows.removed},"next":${JSON.stringify(rows.next)},"events":${JSON.stringify(events)},"lastEvent":${this.events.last}}`;
  }

  /** `GET /v1/dashboard/history` as JSON text: every proxy's series, or only those of `keys`. */
  historyJsonText(keys?: readonly string[]): string {
    this.refresh();
    if (keys) return JSON.stringify(this.history.body(this.sampledAt, keys));
    if (this.historyJson?.at !== this.sampledAt) {
      this.historyJson = { at: this.sampledAt, json: JSON.stringify(this.history.body(this.sampledAt)) };
    }
    return this.historyJson.json;
  }

  private refresh(): void {
    if (this.deps.clock.now() - this.sampledAt >= this.o.freshMs) this.sample();
  }

  private addAll(events: DerivedEvent[]): void {
    const at = this.deps.clock.now();
    for (const e of events) this.events.add(at, e.kind, e.proxy, e.message);
  }

  /** One look at both stores: rows, events from the differences, history, cached JSON. */
  private sample(): void {
    const now = this.deps.clock.now();
    const { leases } = this.deps;
    const snapshots = leases.snapshot();
    const origins = leases.cooldownOrigins();
    const proxies = (this.watching ? this.proxies : undefined) ?? this.deps.store.proxies.list();
    this.proxies = proxies;
    const rows = fleetRows(snapshots, proxies, origins);
    const found = fleetEvents(this.observed, snapshots, origins, now);
    this.addAll(found.events);
    this.observed = found.observed;
    for (const r of rows) this.history.record(r.key, r.healthy ? r.latencyMillis : null, now);
    this.history.retain(new Set(rows.map((r) => r.key)));
    const head: Pick<DashboardState, 'now' | 'totals' | 'pools' | 'leases' | 'providers'> = {
      now: new Date(now).toISOString(),
      totals: fleetTotals(rows, now),
      pools: this.o.pools(rows),
      leases: leaseHolders(leases.liveLeases(MAX_LEASE_HOLDERS)),
      providers: providerSummaries(this.deps.store.providerHealths.list()),
    };
    this.rows.apply(rows);
    this.headJson = JSON.stringify(head).slice(0, -1);
    this.sampledAt = now;
  }
}
