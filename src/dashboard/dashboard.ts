/**
 * dashboard/dashboard — the server side of the dashboard (docs/dashboard.md): samples the lease
 * store and the object store on a timer (and when a viewer asks for a fresher picture), turns
 * the differences into events, keeps the latency history, and caches the JSON it serves, so
 * any number of viewers cost one snapshot per refresh and the lease API's paths do no extra work.
 */
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
import { type DerivedEvent, fleetEvents, type Observed } from './snapshot-events.ts';
import type { DashboardState } from './web/types.ts';

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
  /** The state without its events: `{…}` minus the closing brace, so events can be appended. */
  private fleetJson = '';
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
  }

  /** Watches the Proxies and ProxyPools and samples every idle period until `signal` aborts. */
  async run(signal: AbortSignal): Promise<void> {
    const { clock } = this.deps;
    const unsubscribe = this.deps.store.proxies.watch((e) => this.addAll(objectEvents(e)));
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
      unsubscribe();
      unsubscribePools();
    }
  }

  /** `GET /v1/dashboard/state` as JSON text: the fleet now and the events after `after`. */
  stateJson(after: number): string {
    this.refresh();
    const events = this.events.since(after);
    return `${this.fleetJson},"events":${JSON.stringify(events)},"lastEvent":${this.events.last}}`;
  }

  /** `GET /v1/dashboard/history` as JSON text. */
  historyJsonText(): string {
    this.refresh();
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
    const rows = fleetRows(snapshots, this.deps.store.proxies.list(), origins);
    const found = fleetEvents(this.observed, snapshots, origins, now);
    this.addAll(found.events);
    this.observed = found.observed;
    for (const r of rows) this.history.record(r.key, r.healthy ? r.latencyMillis : null, now);
    this.history.retain(new Set(rows.map((r) => r.key)));
    const state: Omit<DashboardState, 'events' | 'lastEvent'> = {
      now: new Date(now).toISOString(),
      totals: fleetTotals(rows, now),
      proxies: rows,
      pools: this.o.pools(rows),
      leases: leaseHolders(leases.liveLeases(MAX_LEASE_HOLDERS)),
      providers: providerSummaries(this.deps.store.providerHealths.list()),
    };
    this.fleetJson = JSON.stringify(state).slice(0, -1);
    this.sampledAt = now;
  }
}
