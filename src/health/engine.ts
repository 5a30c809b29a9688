/**
 * health/engine — keeps every serving Proxy probed (see docs/health.md): follows the Proxies
 * (with the credentials the shared resolver finds for them), runs one probe per proxy per slot
 * on the shared scheduler, turns results
 * into threshold verdicts for the listener (the lease store) and the status writer, and holds
 * verdicts while the control probe says the probe URL itself is down. Scheduling, control
 * probes, credentials and status writes live in their own modules beside this one.
 */
import { type Span, SpanStatusCode, type Tracer, trace } from '@opentelemetry/api';
import { Registry } from 'prom-client';
import type { CredentialsResolver } from '../api/credentials.ts';
import { keyOf } from '../api/meta.ts';
import { type ProxyObject, servingEndpoint } from '../api/proxy.ts';
import { type Logger, silentLogger } from '../log/index.ts';
import { type Clock, systemClock } from '../runtime/clock.ts';
import type { ObjectStore, Unsubscribe, WatchEvent } from '../runtime/store.ts';
import { ControlProbes, controlKeyOf, REASON_TARGET_DOWN } from './control.ts';
import { ProbeCredentialsSource } from './credentials.ts';
import { createHealthMetrics, type HealthMetrics } from './metrics.ts';
import {
  DEFAULT_HEALTH_CHECK,
  type HealthCheckDefaults,
  latencyMovedALot,
  nextSlot,
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
import { SlotScheduler } from './scheduler.ts';
import { HealthStatusWriter } from './status-writer.ts';
import { type HealthVerdict, newTarget, recordResult, type Target, verdictOf } from './target.ts';

export { REASON_TARGET_DOWN } from './control.ts';
export { REASON_PROBE_SUCCEEDED } from './policy.ts';
export { LATENCY_WRITE_MIN_INTERVAL_MS } from './status-writer.ts';
export type { HealthVerdict } from './target.ts';

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
  /** The process's credentials resolver; one of the engine's own when omitted. */
  credentials?: CredentialsResolver;
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

export class HealthEngine {
  private readonly store: ObjectStore;
  private readonly clock: Clock;
  private readonly log: Logger;
  private readonly defaults: HealthCheckDefaults;
  private readonly probeFn: ProbeFn;
  private readonly probeOptions: Omit<ProbeOptions, 'signal'>;
  private readonly listener: ((v: HealthVerdict) => void) | undefined;
  private readonly tracer: Tracer | undefined;
  private readonly metrics: HealthMetrics;
  private readonly scheduler: SlotScheduler;
  private readonly controls: ControlProbes;
  private readonly credentials: ProbeCredentialsSource;
  private readonly writer: HealthStatusWriter;

  private readonly targets = new Map<string, Target>();
  private unsubscribe: Unsubscribe[] = [];
  private abort = new AbortController();
  private running = false;

  constructor(opts: HealthEngineOptions) {
    this.store = opts.store;
    this.clock = opts.clock ?? systemClock;
    this.log = opts.logger ?? silentLogger();
    this.defaults = { ...DEFAULT_HEALTH_CHECK, ...stripUndefined(opts.defaults ?? {}) };
    validateDefaults(this.defaults);
    const concurrency = opts.concurrency ?? 512;
    if (!Number.isInteger(concurrency) || concurrency < 1) {
      throw new Error(`health concurrency: must be an integer ≥ 1, got ${opts.concurrency}`);
    }
    this.probeFn = opts.probe ?? realProbe;
    this.probeOptions = { tlsSessionCache: new TlsSessionCache(), ...(opts.ca ? { ca: opts.ca } : {}) };
    this.listener = opts.listener;
    this.tracer = opts.traceProbes ? (opts.tracer ?? trace.getTracer('egress-proxies-operator')) : undefined;
    this.metrics = createHealthMetrics(opts.registry ?? new Registry());
    this.scheduler = new SlotScheduler({
      clock: this.clock,
      concurrency,
      run: (key) => this.probeKey(key),
      onError: (key, err) => this.log.error({ err, proxy: key }, 'health probe crashed'),
    });
    this.controls = new ControlProbes({
      clock: this.clock,
      log: this.log,
      probe: opts.directProbe ?? realProbeDirect,
      probeOptions: this.probeOptions,
      targetUp: this.metrics.targetUp,
      enabled: opts.controlProbe ?? true,
    });
    this.credentials = new ProbeCredentialsSource({
      store: this.store,
      clock: this.clock,
      log: this.log,
      ...(opts.credentials ? { resolver: opts.credentials } : {}),
    });
    this.writer = new HealthStatusWriter({
      store: this.store,
      clock: this.clock,
      log: this.log,
      isCurrent: (t) => this.targets.get(t.key) === t,
    });
  }

  /** Subscribes to Proxies and starts probing. Idempotent. */
  start(): void {
    if (this.running) return;
    this.running = true;
    this.abort = new AbortController();
    this.scheduler.start();
    this.controls.start();
    // Secret events need no watch here: the credentials resolver follows them.
    this.unsubscribe.push(this.store.proxies.watch((ev) => this.onProxyEvent(ev)));
    for (const p of this.store.proxies.list()) this.upsert(p);
  }

  /** Stops probing, aborts probes in flight and waits for them to settle. */
  async stop(): Promise<void> {
    if (!this.running) return;
    this.running = false;
    for (const u of this.unsubscribe.splice(0)) u();
    this.abort.abort();
    await Promise.all([this.scheduler.stop(), this.controls.stop()]);
    await this.writer.settle();
    for (const t of [...this.targets.values()]) this.remove(t.key, t.uid);
    this.credentials.close();
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
    if (this.running) this.scheduler.runNow(key);
  }

  /** Current verdict as the engine sees it (undefined before the first probe). */
  verdict(key: string): HealthVerdict | undefined {
    const t = this.targets.get(key);
    if (!t || t.verdict.healthy === undefined) return undefined;
    return verdictOf(t);
  }

  stats(): HealthEngineStats {
    const s = this.scheduler.stats();
    return {
      probes: s.runs,
      skipped: s.skipped,
      maxLagMs: s.maxLagMs,
      statusWrites: this.writer.writes,
      inFlight: this.scheduler.inFlight,
      targets: this.targets.size,
    };
  }

  /** Reset the lag/probe counters (benchmarks measure a window). */
  resetStats(): void {
    this.scheduler.resetStats();
    this.writer.resetStats();
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

  private upsert(proxy: ProxyObject): void {
    const key = keyOf(proxy);
    const uid = proxy.metadata.uid ?? key;
    const endpoint = servingEndpoint(proxy);
    const existing = this.targets.get(key);
    if (existing && (!endpoint || existing.uid !== uid)) this.remove(key, existing.uid);
    if (!endpoint) return;
    const check = resolveCheck(this.defaults, proxy);
    this.credentials.track(key, proxy);
    const current = this.targets.get(key);
    if (!current) {
      this.add(proxy, key, uid, endpoint, check);
      return;
    }
    const retime = current.check.intervalMs !== check.intervalMs;
    const oldControl = current.controlKey;
    current.host = endpoint.host;
    current.port = endpoint.port;
    current.check = check;
    current.controlKey = controlKeyOf(check);
    if (oldControl !== current.controlKey) {
      this.controls.release(oldControl);
      this.controls.acquire(check);
    }
    if (retime) {
      const offset = scheduleOffset(uid, check.intervalMs);
      this.scheduler.retime(key, check.intervalMs, nextSlot(this.clock.now(), offset, check.intervalMs));
    }
  }

  private add(
    proxy: ProxyObject,
    key: string,
    uid: string,
    endpoint: { host: string; port: number },
    check: ResolvedCheck,
  ): void {
    const namespace = proxy.metadata.namespace ?? '';
    const name = proxy.metadata.name;
    const t = newTarget({
      key,
      uid,
      namespace,
      name,
      host: endpoint.host,
      port: endpoint.port,
      check,
      controlKey: controlKeyOf(check),
      storedLatency: proxy.status?.health?.latencyMillis,
      histogram: this.metrics.duration.labels({ namespace, proxy: name }),
    });
    this.targets.set(key, t);
    this.controls.acquire(check);
    const offset = scheduleOffset(uid, check.intervalMs);
    this.scheduler.add(key, check.intervalMs, nextSlot(this.clock.now(), offset, check.intervalMs));
  }

  private remove(key: string, uid: string | undefined): void {
    const t = this.targets.get(key);
    if (!t || (uid !== undefined && t.uid !== uid)) return;
    this.targets.delete(key);
    this.scheduler.delete(key);
    this.credentials.forget(key);
    this.controls.release(t.controlKey);
    this.metrics.duration.remove({ namespace: t.namespace, proxy: t.name });
    for (const reason of t.failureReasons) {
      this.metrics.failures.remove({ namespace: t.namespace, proxy: t.name, reason });
    }
  }

  // ---- probing ----

  private async probeKey(key: string): Promise<void> {
    const t = this.targets.get(key);
    if (!t) return;
    // Credentials of a cached Secret, or a remembered read, resolve within this turn.
    const creds = await this.credentials.get(key, this.abort.signal);
    if (creds === null) return; // could not read them: neither success nor failure
    const target = creds
      ? { host: t.host, port: t.port, credentials: creds }
      : { host: t.host, port: t.port };
    const check = { url: t.check.url, expectStatus: t.check.expectStatus, timeoutMs: t.check.timeoutMs };
    const span = this.startSpan(t);
    const result = await this.probeFn(target, check, { ...this.probeOptions, signal: this.abort.signal });
    if (span) endSpan(span, result);
    if (this.running) this.handleResult(t, result);
  }

  private startSpan(t: Target): Span | undefined {
    return this.tracer?.startSpan('health.probe', {
      attributes: { 'proxy.namespace': t.namespace, 'proxy.name': t.name, 'health.url': t.check.shownUrl },
    });
  }

  // ---- results and verdicts ----

  private handleResult(t: Target, r: ProbeResult): void {
    if (this.targets.get(t.key) !== t) return; // deleted or recreated while probing
    t.histogram.observe(r.latencyMs / 1000);
    if (!r.ok) {
      if (r.reason === 'ProxyAuthRequired') this.credentials.invalidate(t.key);
      if (this.controls.frozen(t.controlKey)) {
        this.countFailure(t, REASON_TARGET_DOWN);
        this.writer.maybeWrite(t, this.abort.signal);
        return; // frozen: the target is down, not the proxy
      }
      this.countFailure(t, r.reason);
    }
    const now = this.clock.now();
    const changed = recordResult(t, r, now);
    if (changed !== undefined) {
      this.writer.verdictChanged(t);
      this.log.info(
        { proxy: t.key, healthy: changed, reason: t.last.reason, message: t.last.message },
        changed ? 'proxy healthy' : 'proxy unhealthy',
      );
      if (changed) t.latencyReported = r.latencyMs;
      this.notify(t);
    } else if (r.ok && t.verdict.healthy) {
      if (latencyMovedALot(t.latencyReported, r.latencyMs)) {
        t.latencyReported = r.latencyMs;
        this.notify(t);
      }
      this.writer.latencyObserved(t, r.latencyMs, now);
    }
    this.writer.maybeWrite(t, this.abort.signal);
  }

  private countFailure(t: Target, reason: string): void {
    t.failureReasons.add(reason);
    this.metrics.failures.inc({ namespace: t.namespace, proxy: t.name, reason });
  }

  private notify(t: Target): void {
    if (!this.listener) return;
    try {
      this.listener(verdictOf(t));
    } catch (err) {
      this.log.error({ err, proxy: t.key }, 'health verdict listener threw');
    }
  }
}

function endSpan(span: Span, result: ProbeResult): void {
  span.setAttribute('health.ok', result.ok);
  span.setAttribute('health.latency_ms', result.latencyMs);
  if (!result.ok) {
    span.setAttribute('health.reason', result.reason);
    span.setStatus({ code: SpanStatusCode.ERROR, message: result.message });
  }
  span.end();
}

function stripUndefined<T extends object>(o: T): Partial<T> {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as Partial<T>;
}
