/**
 * health/engine — keeps every addressable Proxy probed (SPEC §5): a drift-free schedule with a
 * stable per-proxy offset and a global concurrency cap, threshold verdicts, transition-only
 * status writes that never clobber the reconciler's conditions, a direct control probe per URL
 * so a dead test URL freezes verdicts instead of failing the fleet, metrics, optional spans,
 * and a listener that feeds verdicts straight into the lease store.
 */
import { type Span, SpanStatusCode, type Tracer, trace } from '@opentelemetry/api';
import type { Logger } from 'pino';
import { Counter, Gauge, Histogram, Registry } from 'prom-client';
import { setCondition } from '../api/conditions.ts';
import { CONDITION_HEALTHY } from '../api/constants.ts';
import { credentialsSecretKey, readProxyCredentials } from '../api/credentials.ts';
import { type Condition, keyOf, parseKey, type Secret } from '../api/meta.ts';
import type { ProxyObject } from '../api/proxy.ts';
import { silentLogger } from '../log/index.ts';
import type { Credentials } from '../provider/contract.ts';
import { type Clock, systemClock, type TimerHandle } from '../runtime/clock.ts';
import {
  isConflict,
  isNotFound,
  type ObjectStore,
  type Unsubscribe,
  type WatchEvent,
} from '../runtime/store.ts';
import {
  applyResult,
  DEFAULT_HEALTH_CHECK,
  type HealthCheckDefaults,
  latencyMovedALot,
  nextSlot,
  proxyAddress,
  type ResolvedCheck,
  resolveCheck,
  scheduleOffset,
  validateDefaults,
} from './policy.ts';
import {
  type DirectProbeFn,
  type ProbeFn,
  type ProbeOptions,
  type ProbeResult,
  probe as realProbe,
  probeDirect as realProbeDirect,
  TlsSessionCache,
} from './probe.ts';

export const REASON_PROBE_SUCCEEDED = 'ProbeSucceeded';
export const REASON_TARGET_DOWN = 'TargetDown';
/** Status writes of latency alone: at most this often per proxy. */
export const LATENCY_WRITE_MIN_INTERVAL_MS = 60_000;
/** Credentials are re-read at least this often (and at once after a 407). */
const CREDENTIALS_TTL_MS = 5 * 60_000;
const CONFLICT_RETRIES = 5;

export interface HealthVerdict {
  /** `namespace/name`. */
  key: string;
  uid: string;
  healthy: boolean;
  latencyMillis?: number;
  /** Probe reason of the failure that made it unhealthy. */
  reason?: string;
}

export interface HealthEngineOptions {
  store: ObjectStore;
  clock?: Clock;
  logger?: Logger;
  /** Metrics are registered here; a private registry when omitted. */
  registry?: Registry;
  /** Engine-wide defaults; spec.healthCheck overrides them per proxy. */
  defaults?: Partial<HealthCheckDefaults>;
  /** Probes in flight at once, fleet-wide. Default 512. */
  concurrency?: number;
  /** Fetch each probe URL directly to tell a dead target from dead proxies. Default true. */
  controlProbe?: boolean;
  /** Extra CA certificates for the probed origins (tests, private targets). */
  ca?: ProbeOptions['ca'];
  probe?: ProbeFn;
  directProbe?: DirectProbeFn;
  /** Called on every verdict change and on large latency changes. Must not throw. */
  listener?: (v: HealthVerdict) => void;
  /** `--trace-health-probes`: one `health.probe` span per probe. */
  traceProbes?: boolean;
  tracer?: Tracer;
}

export interface HealthEngineStats {
  probes: number;
  /** Slots skipped because the previous probe of that proxy was still running. */
  skipped: number;
  /** Largest start delay behind schedule seen so far, ms. */
  maxLagMs: number;
  inFlight: number;
  targets: number;
  statusWrites: number;
}

interface Target {
  key: string;
  uid: string;
  namespace: string;
  name: string;
  host: string;
  port: number;
  check: ResolvedCheck;
  controlKey: string;
  offset: number;
  /** Bumped when the schedule changes: stale heap entries carry an older token. */
  token: number;
  inFlight: boolean;
  queued: boolean;
  queuedDue: number;
  state: { healthy: boolean | undefined; consecutiveSuccesses: number; consecutiveFailures: number };
  lastReason?: string;
  lastMessage?: string;
  lastLatency?: number;
  lastProbeTime?: number;
  /** Verdict transitions so far, and the one last persisted. */
  version: number;
  writtenVersion: number;
  writing: boolean;
  latencyWritten?: number;
  latencyWrittenAt: number;
  latencyDirty: boolean;
  latencyReported?: number;
  creds?: Credentials;
  /** Name of the credentials Secret; a change invalidates the cached credentials. */
  credsRef: string;
  credsAt: number;
  credsLoaded: boolean;
  reprobe: boolean;
  histogram: { observe(v: number): void };
  failureReasons: Set<string>;
}

interface Control {
  key: string;
  url: string;
  expectStatus: number;
  intervalMs: number;
  timeoutMs: number;
  up: boolean | undefined;
  /**
   * Whether a direct fetch ever worked. An operator without direct egress can never reach the
   * URL; freezing on that would hide every dead proxy forever, so freezing needs it once up.
   */
  everUp: boolean;
  users: number;
  timer?: TimerHandle;
  inFlight: boolean;
}

interface HeapEntry {
  due: number;
  target: Target;
  token: number;
}

/** Binary min-heap on `due`. */
class DueHeap {
  private items: HeapEntry[] = [];
  get size(): number {
    return this.items.length;
  }
  peek(): HeapEntry | undefined {
    return this.items[0];
  }
  push(e: HeapEntry): void {
    const a = this.items;
    a.push(e);
    let i = a.length - 1;
    while (i > 0) {
      const p = (i - 1) >> 1;
      if (a[p]!.due <= e.due) break;
      a[i] = a[p]!;
      i = p;
    }
    a[i] = e;
  }
  pop(): HeapEntry | undefined {
    const a = this.items;
    const top = a[0];
    const last = a.pop();
    if (a.length > 0 && last) {
      let i = 0;
      for (;;) {
        const l = 2 * i + 1;
        if (l >= a.length) break;
        const r = l + 1;
        const c = r < a.length && a[r]!.due < a[l]!.due ? r : l;
        if (a[c]!.due >= last.due) break;
        a[i] = a[c]!;
        i = c;
      }
      a[i] = last;
    }
    return top;
  }
  clear(): void {
    this.items = [];
  }
}

const controlKeyOf = (url: string, expectStatus: number) => `${expectStatus} ${url}`;

export class HealthEngine {
  private readonly store: ObjectStore;
  private readonly clock: Clock;
  private readonly log: Logger;
  private readonly defaults: HealthCheckDefaults;
  private readonly concurrency: number;
  private readonly controlEnabled: boolean;
  private readonly probeFn: ProbeFn;
  private readonly directProbeFn: DirectProbeFn;
  private readonly ca: ProbeOptions['ca'];
  private readonly listener: ((v: HealthVerdict) => void) | undefined;
  private readonly tracer: Tracer | undefined;
  private readonly sessions = new TlsSessionCache();

  private readonly targets = new Map<string, Target>();
  private readonly controls = new Map<string, Control>();
  private readonly heap = new DueHeap();
  private readonly waiting: Target[] = [];
  private timer: TimerHandle | undefined;
  private timerAt = Number.POSITIVE_INFINITY;
  private unsubscribe: Unsubscribe[] = [];
  private abort = new AbortController();
  private running = false;
  private inFlight = 0;
  private readonly pending = new Set<Promise<void>>();
  private readonly statsData = { probes: 0, skipped: 0, maxLagMs: 0, statusWrites: 0 };

  private readonly durationHist: Histogram<'namespace' | 'proxy'>;
  private readonly failuresCounter: Counter<'namespace' | 'proxy' | 'reason'>;
  private readonly targetUp: Gauge<'url'>;

  constructor(opts: HealthEngineOptions) {
    this.store = opts.store;
    this.clock = opts.clock ?? systemClock;
    this.log = opts.logger ?? silentLogger();
    this.defaults = { ...DEFAULT_HEALTH_CHECK, ...stripUndefined(opts.defaults ?? {}) };
    validateDefaults(this.defaults);
    this.concurrency = opts.concurrency ?? 512;
    if (!Number.isInteger(this.concurrency) || this.concurrency < 1) {
      throw new Error(`health concurrency: must be an integer ≥ 1, got ${opts.concurrency}`);
    }
    this.controlEnabled = opts.controlProbe ?? true;
    this.probeFn = opts.probe ?? realProbe;
    this.directProbeFn = opts.directProbe ?? realProbeDirect;
    this.ca = opts.ca;
    this.listener = opts.listener;
    this.tracer = opts.traceProbes ? (opts.tracer ?? trace.getTracer('egress-proxies-operator')) : undefined;
    const registers = [opts.registry ?? new Registry()];
    this.durationHist = new Histogram({
      name: 'proxy_operator_healthcheck_duration_seconds',
      help: 'Duration of health probes through each proxy (start to response headers, or to failure).',
      labelNames: ['namespace', 'proxy'],
      buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
      registers,
    });
    this.failuresCounter = new Counter({
      name: 'proxy_operator_healthcheck_failures_total',
      help: 'Failed health probes by reason (TargetDown: failed while the probe URL itself was down).',
      labelNames: ['namespace', 'proxy', 'reason'],
      registers,
    });
    this.targetUp = new Gauge({
      name: 'proxy_operator_healthcheck_target_up',
      help: 'Whether the probe URL answers when fetched directly, without a proxy (the control probe).',
      labelNames: ['url'],
      registers,
    });
  }

  /** Subscribes to Proxies and starts probing. Idempotent. */
  start(): void {
    if (this.running) return;
    this.running = true;
    this.abort = new AbortController();
    this.unsubscribe.push(this.store.proxies.watch((ev) => this.onProxyEvent(ev)));
    this.unsubscribe.push(this.store.secrets.watch((ev) => this.onSecretEvent(ev)));
    for (const p of this.store.proxies.list()) this.upsert(p);
  }

  /** Stops probing, aborts probes in flight and waits for them to settle. */
  async stop(): Promise<void> {
    if (!this.running) return;
    this.running = false;
    for (const u of this.unsubscribe.splice(0)) u();
    this.abort.abort();
    if (this.timer) this.clock.clearTimeout(this.timer);
    this.timer = undefined;
    this.timerAt = Number.POSITIVE_INFINITY;
    for (const c of this.controls.values()) if (c.timer) this.clock.clearTimeout(c.timer);
    await Promise.allSettled([...this.pending]);
    for (const t of [...this.targets.values()]) this.remove(t.key, t.uid);
    this.heap.clear();
    this.waiting.length = 0;
  }

  /** Runs until the signal aborts (a manager Runnable). */
  async run(signal: AbortSignal): Promise<void> {
    this.start();
    if (!signal.aborted)
      await new Promise<void>((r) => signal.addEventListener('abort', () => r(), { once: true }));
    await this.stop();
  }

  /** Probes `key` now (out of schedule), e.g. after a client reported the proxy `failed`. */
  requestProbe(key: string): void {
    const t = this.targets.get(key);
    if (!t || !this.running) return;
    if (t.inFlight) {
      t.reprobe = true;
      return;
    }
    this.dispatch(t, this.clock.now(), true);
  }

  /** Current verdict as the engine sees it (undefined before the first probe). */
  verdict(key: string): HealthVerdict | undefined {
    const t = this.targets.get(key);
    if (!t || t.state.healthy === undefined) return undefined;
    return this.verdictOf(t);
  }

  stats(): HealthEngineStats {
    return { ...this.statsData, inFlight: this.inFlight, targets: this.targets.size };
  }

  /** Reset the lag/probe counters (benchmarks measure a window). */
  resetStats(): void {
    Object.assign(this.statsData, { probes: 0, skipped: 0, maxLagMs: 0, statusWrites: 0 });
  }

  // ---- object events ----

  private onProxyEvent(ev: WatchEvent<ProxyObject>): void {
    try {
      if (ev.type === 'DELETED') this.remove(keyOf(ev.object), ev.object.metadata.uid);
      else this.upsert(ev.object);
    } catch (err) {
      this.log.error({ err }, 'health engine failed to handle a Proxy event');
    }
  }

  private onSecretEvent(ev: WatchEvent<Secret>): void {
    const ns = ev.object.metadata.namespace ?? '';
    const name = ev.object.metadata.name;
    for (const t of this.targets.values()) {
      if (t.namespace === ns && t.credsRef === name) t.credsLoaded = false;
    }
  }

  private upsert(proxy: ProxyObject): void {
    const key = keyOf(proxy);
    const uid = proxy.metadata.uid ?? key;
    const addr = proxyAddress(proxy);
    const existing = this.targets.get(key);
    if (!addr) {
      if (existing) this.remove(key, existing.uid);
      return;
    }
    if (existing && existing.uid !== uid) this.remove(key, existing.uid);
    const check = resolveCheck(this.defaults, proxy);
    const current = this.targets.get(key);
    if (current) {
      const reschedule = current.check.intervalMs !== check.intervalMs;
      const oldControl = current.controlKey;
      current.host = addr.host;
      current.port = addr.port;
      const ref = credentialsSecretKey(proxy).name;
      if (ref !== current.credsRef) {
        current.credsRef = ref;
        current.credsLoaded = false;
      }
      current.check = check;
      current.controlKey = controlKeyOf(check.url, check.expectStatus);
      if (oldControl !== current.controlKey) {
        this.releaseControl(oldControl);
        this.acquireControl(current);
      }
      if (reschedule) {
        current.offset = scheduleOffset(uid, check.intervalMs);
        this.schedule(current, nextSlot(this.clock.now(), current.offset, check.intervalMs));
      }
      return;
    }
    const namespace = proxy.metadata.namespace ?? '';
    const name = proxy.metadata.name;
    const existingHealth = proxy.status?.health;
    const t: Target = {
      key,
      uid,
      namespace,
      name,
      host: addr.host,
      port: addr.port,
      check,
      controlKey: controlKeyOf(check.url, check.expectStatus),
      offset: scheduleOffset(uid, check.intervalMs),
      token: 0,
      inFlight: false,
      queued: false,
      queuedDue: 0,
      state: { healthy: undefined, consecutiveSuccesses: 0, consecutiveFailures: 0 },
      version: 0,
      writtenVersion: 0,
      writing: false,
      latencyWritten: existingHealth?.latencyMillis,
      latencyWrittenAt: Number.NEGATIVE_INFINITY,
      latencyDirty: false,
      credsRef: credentialsSecretKey(proxy).name,
      credsAt: 0,
      credsLoaded: false,
      reprobe: false,
      histogram: this.durationHist.labels({ namespace, proxy: name }),
      failureReasons: new Set(),
    };
    this.targets.set(key, t);
    this.acquireControl(t);
    this.schedule(t, nextSlot(this.clock.now(), t.offset, check.intervalMs));
  }

  private remove(key: string, uid: string | undefined): void {
    const t = this.targets.get(key);
    if (!t || (uid !== undefined && t.uid !== uid)) return;
    this.targets.delete(key);
    t.token++;
    this.releaseControl(t.controlKey);
    this.durationHist.remove({ namespace: t.namespace, proxy: t.name });
    for (const reason of t.failureReasons) {
      this.failuresCounter.remove({ namespace: t.namespace, proxy: t.name, reason });
    }
  }

  // ---- scheduling ----

  private schedule(t: Target, due: number): void {
    t.token++;
    this.heap.push({ due, target: t, token: t.token });
    this.arm();
  }

  private arm(): void {
    if (!this.running) return;
    const top = this.heap.peek();
    if (!top) return;
    if (this.timer && this.timerAt <= top.due) return;
    if (this.timer) this.clock.clearTimeout(this.timer);
    this.timerAt = top.due;
    this.timer = this.clock.setTimeout(() => this.tick(), Math.max(0, top.due - this.clock.now()));
  }

  private tick(): void {
    this.timer = undefined;
    this.timerAt = Number.POSITIVE_INFINITY;
    if (!this.running) return;
    const now = this.clock.now();
    for (let top = this.heap.peek(); top && top.due <= now; top = this.heap.peek()) {
      this.heap.pop();
      const t = top.target;
      if (top.token !== t.token || this.targets.get(t.key) !== t) continue;
      const interval = t.check.intervalMs;
      let next = top.due + interval;
      if (next <= now) {
        // Far behind (a stalled event loop): skip the missed slots rather than bursting.
        const missed = Math.floor((now - top.due) / interval);
        this.statsData.skipped += missed;
        next = top.due + (missed + 1) * interval;
      }
      this.heap.push({ due: next, target: t, token: t.token });
      this.dispatch(t, top.due, false);
    }
    this.arm();
  }

  private dispatch(t: Target, due: number, urgent: boolean): void {
    if (t.inFlight) {
      this.statsData.skipped++;
      return;
    }
    if (this.inFlight < this.concurrency) {
      this.startProbe(t, due);
      return;
    }
    if (t.queued) return;
    t.queued = true;
    t.queuedDue = due;
    if (urgent) this.waiting.unshift(t);
    else this.waiting.push(t);
  }

  private drainQueue(): void {
    while (this.inFlight < this.concurrency && this.waiting.length > 0) {
      const t = this.waiting.shift()!;
      t.queued = false;
      if (this.targets.get(t.key) !== t || t.inFlight || !this.running) continue;
      this.startProbe(t, t.queuedDue);
    }
  }

  private startProbe(t: Target, due: number): void {
    const lag = this.clock.now() - due;
    if (lag > this.statsData.maxLagMs) this.statsData.maxLagMs = lag;
    this.statsData.probes++;
    t.inFlight = true;
    this.inFlight++;
    const p = this.runProbe(t)
      .catch((err) => this.log.error({ err, proxy: t.key }, 'health probe crashed'))
      .finally(() => {
        this.pending.delete(p);
        t.inFlight = false;
        this.inFlight--;
        this.drainQueue();
        if (t.reprobe && this.running && this.targets.get(t.key) === t) {
          t.reprobe = false;
          this.dispatch(t, this.clock.now(), true);
        }
      });
    this.pending.add(p);
  }

  private async runProbe(t: Target): Promise<void> {
    // Cached credentials keep the probe start synchronous with its schedule slot.
    const fresh = t.credsLoaded && this.clock.now() - t.credsAt < CREDENTIALS_TTL_MS;
    const creds = fresh ? t.creds : await this.credentials(t);
    if (creds === null) return; // could not read them: neither success nor failure
    const target = creds
      ? { host: t.host, port: t.port, credentials: creds }
      : { host: t.host, port: t.port };
    const check = { url: t.check.url, expectStatus: t.check.expectStatus, timeoutMs: t.check.timeoutMs };
    const opts: ProbeOptions = { tlsSessionCache: this.sessions, signal: this.abort.signal };
    if (this.ca) opts.ca = this.ca;
    let span: Span | undefined;
    if (this.tracer) {
      span = this.tracer.startSpan('health.probe', {
        attributes: { 'proxy.namespace': t.namespace, 'proxy.name': t.name, 'health.url': t.check.url },
      });
    }
    const result = await this.probeFn(target, check, opts);
    if (span) {
      span.setAttribute('health.ok', result.ok);
      span.setAttribute('health.latency_ms', result.latencyMs);
      if (!result.ok) {
        span.setAttribute('health.reason', result.reason);
        span.setStatus({ code: SpanStatusCode.ERROR, message: result.message });
      }
      span.end();
    }
    if (!this.running) return;
    this.handleResult(t, result);
  }

  /** Cached credentials; undefined = none; null = reading failed (skip this probe). */
  private async credentials(t: Target): Promise<Credentials | undefined | null> {
    const now = this.clock.now();
    if (t.credsLoaded && now - t.credsAt < CREDENTIALS_TTL_MS) return t.creds;
    const proxy = this.store.proxies.get(parseKey(t.key));
    if (!proxy || proxy.metadata.uid !== t.uid) return t.creds;
    try {
      t.creds = await readProxyCredentials(this.store.secrets, proxy, this.abort.signal);
      t.credsAt = now;
      t.credsLoaded = true;
      return t.creds;
    } catch (err) {
      this.log.warn(
        { proxy: t.key, err: (err as Error).message },
        'cannot read proxy credentials; probe skipped',
      );
      return null;
    }
  }

  // ---- results, verdicts, status ----

  private handleResult(t: Target, r: ProbeResult): void {
    if (this.targets.get(t.key) !== t) return; // deleted or recreated while probing
    t.histogram.observe(r.latencyMs / 1000);
    const control = this.controls.get(t.controlKey);
    if (!r.ok) {
      if (r.reason === 'ProxyAuthRequired') t.credsLoaded = false;
      if (control?.up === false && control.everUp) {
        this.countFailure(t, REASON_TARGET_DOWN);
        this.maybeWrite(t);
        return; // frozen: the target is down, not the proxy
      }
      this.countFailure(t, r.reason);
    }
    const now = this.clock.now();
    t.lastProbeTime = now;
    if (r.ok) {
      t.lastLatency = r.latencyMs;
      t.lastReason = REASON_PROBE_SUCCEEDED;
      t.lastMessage = `probe of ${t.check.url} answered ${t.check.expectStatus} in ${r.latencyMs} ms`;
    } else {
      t.lastReason = r.reason;
      t.lastMessage = r.message;
    }
    const changed = applyResult(t.state, r.ok, t.check);
    if (changed !== undefined) {
      t.version++;
      this.log.info(
        { proxy: t.key, healthy: changed, reason: t.lastReason, message: t.lastMessage },
        changed ? 'proxy healthy' : 'proxy unhealthy',
      );
      if (changed) t.latencyReported = r.latencyMs;
      this.notify(t);
    } else if (r.ok && t.state.healthy) {
      if (latencyMovedALot(t.latencyReported, r.latencyMs)) {
        t.latencyReported = r.latencyMs;
        this.notify(t);
      }
      if (
        latencyMovedALot(t.latencyWritten, r.latencyMs) &&
        now - t.latencyWrittenAt >= LATENCY_WRITE_MIN_INTERVAL_MS
      ) {
        t.latencyDirty = true;
      }
    }
    this.maybeWrite(t);
  }

  private countFailure(t: Target, reason: string): void {
    t.failureReasons.add(reason);
    this.failuresCounter.inc({ namespace: t.namespace, proxy: t.name, reason });
  }

  private verdictOf(t: Target): HealthVerdict {
    const v: HealthVerdict = { key: t.key, uid: t.uid, healthy: t.state.healthy === true };
    if (t.state.healthy && t.lastLatency !== undefined) v.latencyMillis = t.lastLatency;
    if (!t.state.healthy && t.lastReason) v.reason = t.lastReason;
    return v;
  }

  private notify(t: Target): void {
    if (!this.listener) return;
    try {
      this.listener(this.verdictOf(t));
    } catch (err) {
      this.log.error({ err, proxy: t.key }, 'health verdict listener threw');
    }
  }

  private maybeWrite(t: Target): void {
    if (t.writing || t.state.healthy === undefined) return;
    if (t.version === t.writtenVersion && !t.latencyDirty) return;
    t.writing = true;
    const p = this.writeStatus(t)
      .catch((err) => {
        this.log.warn(
          { proxy: t.key, err: (err as Error).message },
          'health status write failed; retrying on the next probe',
        );
      })
      .finally(() => {
        t.writing = false;
        this.pending.delete(p);
      });
    this.pending.add(p);
  }

  private async writeStatus(t: Target): Promise<void> {
    const version = t.version;
    const healthy = t.state.healthy === true;
    const verdictWrite = version !== t.writtenVersion;
    const now = this.clock.now();
    const nowDate = new Date(now);
    const health: Record<string, unknown> = {
      latencyMillis: healthy && t.lastLatency !== undefined ? t.lastLatency : null,
      lastProbeTime: t.lastProbeTime !== undefined ? new Date(t.lastProbeTime).toISOString() : null,
      consecutiveFailures: t.state.consecutiveFailures,
      lastError: healthy ? null : (t.lastMessage ?? null),
    };
    const key = parseKey(t.key);
    let obj = this.store.proxies.get(key);
    for (let attempt = 0; ; attempt++) {
      if (!obj || obj.metadata.uid !== t.uid || this.targets.get(t.key) !== t) return; // gone or replaced
      const patch: Record<string, unknown> = { health };
      if (verdictWrite) {
        const desired: Omit<Condition, 'lastTransitionTime'> = {
          type: CONDITION_HEALTHY,
          status: healthy ? 'True' : 'False',
          reason: t.lastReason ?? (healthy ? REASON_PROBE_SUCCEEDED : 'ProbeFailed'),
          message: t.lastMessage ?? '',
        };
        const existing = obj.status?.conditions?.find((c) => c.type === CONDITION_HEALTHY);
        if (
          version === 1 &&
          !t.latencyDirty &&
          existing?.status === desired.status &&
          existing.reason === desired.reason
        ) {
          // First verdict after a restart that matches what is stored: nothing to write.
          t.writtenVersion = version;
          t.latencyWrittenAt = now;
          return;
        }
        patch.conditions = setCondition(obj.status?.conditions, desired, nowDate);
      }
      try {
        await this.store.proxies.patchStatus(key, patch, {
          resourceVersion: obj.metadata.resourceVersion,
          signal: this.abort.signal,
        });
        this.statsData.statusWrites++;
        t.writtenVersion = version;
        t.latencyDirty = false;
        if (healthy) {
          t.latencyWritten = t.lastLatency;
          t.latencyWrittenAt = now;
        }
        return;
      } catch (err) {
        if (isNotFound(err)) return;
        if (!isConflict(err) || attempt >= CONFLICT_RETRIES) throw err;
        try {
          obj = await this.store.proxies.read(key, { signal: this.abort.signal });
        } catch (readErr) {
          if (isNotFound(readErr)) return;
          throw readErr;
        }
      }
    }
  }

  // ---- control probes ----

  private acquireControl(t: Target): void {
    if (!this.controlEnabled) return;
    let c = this.controls.get(t.controlKey);
    if (!c) {
      c = {
        key: t.controlKey,
        url: t.check.url,
        expectStatus: t.check.expectStatus,
        intervalMs: t.check.intervalMs,
        timeoutMs: Math.min(t.check.timeoutMs, t.check.intervalMs),
        up: undefined,
        everUp: false,
        users: 0,
        inFlight: false,
      };
      this.controls.set(t.controlKey, c);
      this.scheduleControl(c, this.clock.now());
    }
    c.users++;
    c.intervalMs = Math.min(c.intervalMs, t.check.intervalMs);
  }

  private releaseControl(key: string): void {
    const c = this.controls.get(key);
    if (!c) return;
    c.users--;
    if (c.users > 0) return;
    this.controls.delete(key);
    if (c.timer) this.clock.clearTimeout(c.timer);
    this.publishTargetUp(c.url);
  }

  /** Control probes run at now, then every interval on the same grid (no drift). */
  private scheduleControl(c: Control, due: number): void {
    if (!this.running) return;
    c.timer = this.clock.setTimeout(
      () => {
        c.timer = undefined;
        if (this.controls.get(c.key) !== c || !this.running) return;
        const now = this.clock.now();
        let next = due + c.intervalMs;
        if (next <= now) next = now + c.intervalMs - ((now - due) % c.intervalMs);
        this.scheduleControl(c, next);
        if (!c.inFlight) this.runControl(c);
      },
      Math.max(0, due - this.clock.now()),
    );
  }

  private runControl(c: Control): void {
    c.inFlight = true;
    const opts: ProbeOptions = { tlsSessionCache: this.sessions, signal: this.abort.signal };
    if (this.ca) opts.ca = this.ca;
    const p = this.directProbeFn({ url: c.url, expectStatus: c.expectStatus, timeoutMs: c.timeoutMs }, opts)
      .then((r) => {
        if (!this.running || this.controls.get(c.key) !== c) return;
        const up = r.ok;
        if (up !== c.up) {
          if (!up && !c.everUp) {
            this.log.warn(
              { url: c.url, probeReason: r.reason, message: r.message },
              'health check URL is not reachable directly from the operator; proxy verdicts are not frozen for it until a direct fetch succeeds',
            );
          } else if (!up) {
            this.log.warn(
              { url: c.url, reason: REASON_TARGET_DOWN, probeReason: r.reason, message: r.message },
              'health check target is down when fetched directly; proxy verdicts frozen',
            );
          } else if (c.up === false) {
            this.log.info({ url: c.url }, 'health check target is reachable again; proxy verdicts resume');
          }
          c.up = up;
          if (up) c.everUp = true;
          this.publishTargetUp(c.url);
        }
      })
      .catch((err) => this.log.error({ err, url: c.url }, 'control probe crashed'))
      .finally(() => {
        c.inFlight = false;
        this.pending.delete(p);
      });
    this.pending.add(p);
  }

  private publishTargetUp(url: string): void {
    let any = false;
    let up = true;
    for (const c of this.controls.values()) {
      if (c.url !== url || c.up === undefined) continue;
      any = true;
      up &&= c.up;
    }
    if (any) this.targetUp.set({ url }, up ? 1 : 0);
    else this.targetUp.remove({ url });
  }
}

function stripUndefined<T extends object>(o: T): Partial<T> {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as Partial<T>;
}
