/**
 * health/engine — keeps every serving Proxy probed (see docs/health.md): follows the Proxies
 * (with the credentials their instances serve), and during a replacement also the pending
 * instance, whose verdict starts Unknown and goes to status.replacementHealth instead of the
 * lease store; at the switch the passed verdict carries over, any other change of instance
 * resets it. Runs one probe per target per slot on the shared scheduler, turns results into
 * threshold verdicts for the listener (the lease store) and the status writer, and holds
 * verdicts while the control probe says the probe URL itself is down. Scheduling, control
 * probes, credentials, the target table and status writes live in their own modules.
 */
import { type Span, SpanStatusCode, type Tracer, trace } from '@opentelemetry/api';
import { Registry } from 'prom-client';
import { CONDITION_HEALTHY, DEFAULT_PROXY_PORT } from '../api/constants.ts';
import { keyOf } from '../api/meta.ts';
import { type ProxyObject, proxyType, servingEndpoint } from '../api/proxy.ts';
import { type Logger, silentLogger } from '../log/index.ts';
import { type Clock, systemClock } from '../runtime/clock.ts';
import type { CredentialsResolver } from '../runtime/credentials.ts';
import type { ObjectStore, Unsubscribe, WatchEvent } from '../runtime/store.ts';
import { ControlProbes, REASON_TARGET_DOWN } from './control.ts';
import { ProbeCredentialsSource } from './credentials.ts';
import { createHealthMetrics, type HealthMetrics } from './metrics.ts';
import {
  DEFAULT_HEALTH_CHECK,
  type HealthCheckDefaults,
  latencyMovedALot,
  REASON_NOT_SERVING,
  resolveCheck,
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
import { type HealthVerdict, type ProbedInstance, recordResult, verdictOf } from './probed-instance.ts';
import { ProbedInstanceTable, replacementKey, sameInstance } from './probed-instances.ts';
import { SlotScheduler } from './scheduler.ts';
import { HealthStatusWriter } from './status-writer.ts';

export { REASON_TARGET_DOWN } from './control.ts';
export { REASON_NOT_SERVING, REASON_PROBE_SUCCEEDED } from './policy.ts';
export type { HealthVerdict } from './probed-instance.ts';
export { LATENCY_WRITE_MIN_INTERVAL_MS } from './status-writer.ts';

/**
 * Probe slots due within this many ms start together: spread evenly, a thousand probes a second
 * would wake the event loop a thousand times, and those wake-ups cost more than a quarter of
 * each probe's CPU (docs/architecture.md, Decisions). A probe starts at most this late.
 */
export const PROBE_BATCH_MS = 25;

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
  /**
   * `host:port` of the operator's discovery API as the proxies reach it: what the placeholder
   * host `operator.invalid` of a health-check URL stands for (api/health-defaults).
   */
  operatorAddress?: string;
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
  private readonly operatorAddress: string | undefined;
  private readonly probeFn: ProbeFn;
  private readonly probeOptions: Omit<ProbeOptions, 'signal'>;
  private readonly listener: ((v: HealthVerdict) => void) | undefined;
  private readonly tracer: Tracer | undefined;
  private readonly metrics: HealthMetrics;
  private readonly scheduler: SlotScheduler;
  private readonly controls: ControlProbes;
  private readonly credentials: ProbeCredentialsSource;
  private readonly writer: HealthStatusWriter;

  private readonly targets: ProbedInstanceTable;
  /** Proxies whose serving instance changed or went away: the next one starts gated from Unknown. */
  private readonly renewed = new Set<string>();
  private unsubscribe: Unsubscribe[] = [];
  private abort = new AbortController();
  private running = false;

  constructor(opts: HealthEngineOptions) {
    this.store = opts.store;
    this.clock = opts.clock ?? systemClock;
    this.log = opts.logger ?? silentLogger();
    this.defaults = { ...DEFAULT_HEALTH_CHECK, ...stripUndefined(opts.defaults ?? {}) };
    validateDefaults(this.defaults);
    this.operatorAddress = opts.operatorAddress;
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
      batchMs: PROBE_BATCH_MS,
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
    this.targets = new ProbedInstanceTable({
      clock: this.clock,
      scheduler: this.scheduler,
      controls: this.controls,
      credentials: this.credentials,
      metrics: this.metrics,
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
    for (const t of [...this.targets.values()]) this.targets.remove(t.key, t.uid);
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
      if (ev.type === 'DELETED') {
        this.targets.remove(keyOf(ev.object), ev.object.metadata.uid);
        this.targets.remove(replacementKey(keyOf(ev.object)), ev.object.metadata.uid);
      } else this.upsert(ev.object);
    } catch (err) {
      this.log.error({ err }, 'health engine failed to handle a Proxy event');
    }
  }

  private upsert(proxy: ProxyObject): void {
    const key = keyOf(proxy);
    const uid = proxy.metadata.uid ?? key;
    this.upsertServing(proxy, key, uid);
    this.upsertReplacement(proxy, key, uid);
  }

  /** The instance at status.address (or an External endpoint): probed, and its verdicts leased by. */
  private upsertServing(proxy: ProxyObject, key: string, uid: string): void {
    const endpoint = servingEndpoint(proxy);
    const instance = proxyType(proxy.spec) === 'Managed' ? (proxy.status?.providerID ?? '') : '';
    const existing = this.targets.get(key);
    if (existing && existing.uid !== uid) this.targets.remove(key, existing.uid);
    else if (existing && !endpoint) {
      // Serves nowhere now (a lost instance, a restart, a deletion): its verdict must not outlive it.
      this.targets.remove(key, existing.uid);
      this.forgetVerdict(existing);
      this.renewed.add(key);
    } else if (existing && endpoint && !sameInstance(existing, instance, endpoint)) {
      // Another instance at this proxy: the replacement it passed, or a re-created one.
      this.targets.remove(key, existing.uid);
      const rep = this.targets.get(replacementKey(key));
      if (rep && sameInstance(rep, instance, endpoint)) {
        this.promote(proxy, rep, endpoint);
        return;
      }
      this.forgetVerdict(existing);
      this.renewed.add(key);
    }
    if (!endpoint) {
      this.markNotServing(proxy, key, uid, 'the proxy serves no instance now');
      return;
    }
    const check = resolveCheck(this.defaults, proxy, this.operatorAddress);
    const generation = proxy.status?.credentialsGeneration;
    this.credentials.track(key, proxy, generation);
    const current = this.targets.get(key);
    if (!current) {
      const gated = this.renewed.delete(key);
      this.targets.add(proxy, { key, role: 'serving', instance, generation, gated }, endpoint, check);
      if (gated) this.markNotServing(proxy, key, uid, 'a new instance serves; not judged yet');
      return;
    }
    current.generation = generation;
    this.targets.refresh(current, uid, endpoint, check);
  }

  /** status.pending: probed with its own credentials; its verdict goes to status.replacementHealth only. */
  private upsertReplacement(proxy: ProxyObject, key: string, uid: string): void {
    const rkey = replacementKey(key);
    const pending = proxy.metadata.deletionTimestamp ? undefined : proxy.status?.pending;
    const endpoint = pending?.address
      ? { host: pending.address, port: pending.port ?? proxy.spec.port ?? DEFAULT_PROXY_PORT }
      : undefined;
    const existing = this.targets.get(rkey);
    if (
      existing &&
      (!pending || !endpoint || existing.uid !== uid || !sameInstance(existing, pending.providerID, endpoint))
    ) {
      this.targets.remove(rkey, existing.uid);
    }
    if (!pending || !endpoint) return;
    const check = resolveCheck(this.defaults, proxy, this.operatorAddress);
    const generation = pending.credentialsGeneration;
    this.credentials.track(rkey, proxy, generation);
    const current = this.targets.get(rkey);
    if (!current) {
      const target = { key: rkey, role: 'replacement' as const, instance: pending.providerID, generation };
      this.targets.add(proxy, { ...target, gated: true }, endpoint, check);
      return;
    }
    this.targets.refresh(current, uid, endpoint, check);
  }

  /** The switch: the replacement's verdict (it passed) becomes the serving target's. */
  private promote(proxy: ProxyObject, rep: ProbedInstance, endpoint: { host: string; port: number }): void {
    const key = rep.proxyKey;
    this.targets.remove(rep.key, rep.uid);
    const check = resolveCheck(this.defaults, proxy, this.operatorAddress);
    const generation = proxy.status?.credentialsGeneration;
    this.credentials.track(key, proxy, generation);
    const t = this.targets.add(
      proxy,
      { key, role: 'serving', instance: rep.instance, generation, gated: false },
      endpoint,
      check,
    );
    t.verdict = { ...rep.verdict, gated: false };
    t.last = { ...rep.last };
    t.latencyReported = rep.last.latencyMs;
    // Status must say Healthy for the new instance too (no write when it already does).
    if (t.verdict.healthy !== undefined) this.writer.verdictChanged(t);
    this.notify(t);
  }

  /**
   * Status must not keep a verdict about an instance that no longer serves (Healthy=Unknown,
   * NotServing): leasing and the pool read the condition. No write when there is no verdict
   * to take back, or once the serving target has a verdict of its own.
   */
  private markNotServing(proxy: ProxyObject, key: string, uid: string, message: string): void {
    if (proxy.metadata.deletionTimestamp || proxyType(proxy.spec) !== 'Managed') return;
    const c = proxy.status?.conditions?.find((x) => x.type === CONDITION_HEALTHY);
    if (!c || (c.status === 'Unknown' && c.reason === REASON_NOT_SERVING)) return;
    const unjudged = () => this.targets.get(key)?.verdict.healthy === undefined;
    this.writer.notServing(key, uid, message, unjudged, this.abort.signal);
  }

  /** Tells the lease store the instance it knew is no longer vouched for. */
  private forgetVerdict(t: ProbedInstance): void {
    if (t.role !== 'serving' || t.verdict.healthy !== true) return;
    this.notifyVerdict({ key: t.proxyKey, uid: t.uid, healthy: false, reason: 'InstanceChanged' });
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

  private startSpan(t: ProbedInstance): Span | undefined {
    return this.tracer?.startSpan('health.probe', {
      attributes: { 'proxy.namespace': t.namespace, 'proxy.name': t.name, 'health.url': t.check.shownUrl },
    });
  }

  // ---- results and verdicts ----

  private handleResult(t: ProbedInstance, r: ProbeResult): void {
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
    if (t.role === 'replacement') {
      // Not leased: only its transitions matter, for status.replacementHealth.
      if (changed !== undefined) {
        this.writer.verdictChanged(t);
        this.log.info(
          { proxy: t.proxyKey, providerID: t.instance, reason: t.last.reason, message: t.last.message },
          changed ? 'replacement passed its health checks' : 'replacement failing its health checks',
        );
      }
    } else if (changed !== undefined) {
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

  private countFailure(t: ProbedInstance, reason: string): void {
    t.failureReasons.add(reason);
    this.metrics.failures.inc({ namespace: t.namespace, proxy: t.name, reason });
  }

  private notify(t: ProbedInstance): void {
    if (t.role === 'serving') this.notifyVerdict(verdictOf(t));
  }

  private notifyVerdict(v: HealthVerdict): void {
    if (!this.listener) return;
    try {
      this.listener(v);
    } catch (err) {
      this.log.error({ err, proxy: v.key }, 'health verdict listener threw');
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
