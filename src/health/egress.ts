/**
 * health/egress — the optional egress-IP check (`--egress-ip-url`, see docs/health.md): every
 * few minutes each serving proxy fetches a "what is my IP" URL through itself, and the address
 * the origin reports is published in `status.egressIP` (only when it changed, only that field),
 * so duplicate egress IPs and NAT surprises are visible. Leader-only: it writes status.
 * Messages and logs name proxies, hosts and ports only: never credentials.
 */
import { type Counter, Registry } from 'prom-client';
import type { Credentials } from '../api/credentials.ts';
import { keyOf, parseKey } from '../api/meta.ts';
import { type ProxyObject, proxyType, servingEndpoint } from '../api/proxy.ts';
import { redactUrl } from '../api/url.ts';
import { type Logger, silentLogger } from '../log/index.ts';
import { collectedGauge, counter } from '../metrics/register.ts';
import { type Clock, systemClock } from '../runtime/clock.ts';
import { type CredentialsResolver, createCredentialsResolver } from '../runtime/credentials.ts';
import { retryOnConflict } from '../runtime/retry.ts';
import { isConflict, isNotFound, type ObjectStore } from '../runtime/store.ts';
import { countDuplicates, parseEgressAnswer } from './egress-answer.ts';
import { EgressFetchError, fetchThroughProxy } from './egress-fetch.ts';
import { httpUrlProblem, nextSlot, scheduleOffset } from './policy.ts';
import type { ProbeOptions } from './probe.ts';
import { SlotScheduler } from './scheduler.ts';

export { countDuplicates, parseEgressAnswer } from './egress-answer.ts';
export { EgressFetchError, fetchThroughProxy } from './egress-fetch.ts';

export const DEFAULT_EGRESS_INTERVAL_MS = 5 * 60_000;
export const DEFAULT_EGRESS_CONCURRENCY = 16;
export const DEFAULT_EGRESS_TIMEOUT_MS = 10_000;

export type EgressCheckResult = 'ok' | 'failed' | 'bad_answer';
export const EGRESS_CHECK_RESULTS: readonly EgressCheckResult[] = ['ok', 'failed', 'bad_answer'];

export interface EgressIpCheckerOptions {
  store: ObjectStore;
  /** The "what is my IP" URL (`--egress-ip-url`), http or https. */
  url: string;
  /** Each proxy is checked once per interval, at a stable offset. Default 5 min. */
  intervalMs?: number;
  /** Checks in flight at once, fleet-wide. Default 16. */
  concurrency?: number;
  /** One check, connect to last body byte. Default 10 s. */
  timeoutMs?: number;
  clock?: Clock;
  log?: Logger;
  /** Metrics are registered here; a private registry when omitted. */
  registry?: Registry;
  /** Extra trust anchors for an https URL (tests, private services); system roots otherwise. */
  ca?: ProbeOptions['ca'];
  /** The process's credentials resolver; one of the checker's own when omitted. */
  credentials?: CredentialsResolver;
  /**
   * Proxies whose status.egressIP another writer owns (a provider that assigns the source
   * address, docs/providers/local.md): never checked, so the field has one writer.
   */
  skip?: (p: ProxyObject) => boolean;
}

/** What one `checkOnce` did, for callers and tests. */
export interface EgressCheckSummary {
  ok: number;
  failed: number;
  badAnswer: number;
  /** Managed proxies without credentials yet. */
  skipped: number;
  /** status.egressIP writes. */
  written: number;
}

/** Validates the options; the error names the field. */
export function validateEgressOptions(o: EgressIpCheckerOptions): void {
  const problem = httpUrlProblem(o.url);
  if (problem) throw new Error(`--egress-ip-url: ${problem}`);
  const int = (name: string, v: number | undefined, min: number, max: number) => {
    if (v !== undefined && (!Number.isInteger(v) || v < min || v > max)) {
      throw new Error(`egress-ip ${name}: must be an integer in [${min}, ${max}], got ${v}`);
    }
  };
  int('intervalMs', o.intervalMs, 1000, 24 * 3_600_000);
  int('concurrency', o.concurrency, 1, 10_000);
  int('timeoutMs', o.timeoutMs, 1, 3_600_000);
}

type CheckOutcome = EgressCheckResult | 'written' | 'skipped';

/** Per-proxy memory between checks (keyed by `namespace/name`). */
interface TargetState {
  uid: string;
  /** The address last scheduled for: a change means a new instance, with a possibly new IP. */
  address: string;
  /** Last IP seen by this process, and the last one logged about (change / duplicate). */
  ip?: string;
  announced?: string;
  /** Last outcome, so a failing proxy warns once, not every interval. */
  lastResult?: EgressCheckResult;
}

/** Where a proxy is checked, as one comparable string. */
function addressKey(p: ProxyObject): string | undefined {
  const a = servingEndpoint(p);
  return a ? `${a.host}:${a.port}` : undefined;
}

export class EgressIpChecker {
  private readonly store: ObjectStore;
  private readonly url: string;
  private readonly intervalMs: number;
  private readonly timeoutMs: number;
  private readonly concurrency: number;
  private readonly clock: Clock;
  private readonly log: Logger;
  private readonly ca: ProbeOptions['ca'];
  private readonly credentials: CredentialsResolver;
  private readonly skip: (p: ProxyObject) => boolean;
  private readonly checks: Counter<'result'>;
  private readonly states = new Map<string, TargetState>();
  /** The periodic schedule while `run` is running. */
  private scheduler: SlotScheduler | undefined;
  /** `checkOnce` checks waiting or running. */
  private oneShot = 0;
  /** Redacted URL (no userinfo, query or fragment) for logs. */
  private readonly urlForLogs: string;

  constructor(opts: EgressIpCheckerOptions) {
    validateEgressOptions(opts);
    this.store = opts.store;
    this.url = opts.url;
    this.urlForLogs = redactUrl(opts.url);
    this.intervalMs = opts.intervalMs ?? DEFAULT_EGRESS_INTERVAL_MS;
    this.timeoutMs = opts.timeoutMs ?? DEFAULT_EGRESS_TIMEOUT_MS;
    this.concurrency = opts.concurrency ?? DEFAULT_EGRESS_CONCURRENCY;
    this.clock = opts.clock ?? systemClock;
    this.log = opts.log ?? silentLogger();
    this.ca = opts.ca;
    this.skip = opts.skip ?? (() => false);
    // Read fresh at every check (no remembered reads), so an own resolver holds nothing to close.
    this.credentials = opts.credentials ?? createCredentialsResolver(this.store, { clock: this.clock });
    const registry = opts.registry ?? new Registry();
    this.checks = counter(registry, {
      name: 'proxy_operator_egress_ip_checks_total',
      help: 'Egress-IP checks through proxies, by result (ok, failed, bad_answer).',
      labelNames: ['result'],
    });
    for (const r of EGRESS_CHECK_RESULTS) this.checks.inc({ result: r }, 0);
    const store = this.store;
    collectedGauge(registry, {
      name: 'proxy_operator_egress_ip_duplicates',
      help: 'Addressable proxies whose published egress IP is shared with another proxy.',
      collect() {
        const ips: string[] = [];
        for (const p of store.proxies.list()) {
          const ip = p.status?.egressIP;
          if (ip && servingEndpoint(p)) ips.push(ip);
        }
        this.set(countDuplicates(ips));
      },
    });
  }

  /** Checks scheduled or running right now. */
  get inFlight(): number {
    return (this.scheduler?.busy ?? 0) + this.oneShot;
  }

  /** Manager runnable body: checks every serving proxy once per interval until `signal` aborts. */
  async run(signal: AbortSignal): Promise<void> {
    await this.store.proxies.synced(signal).catch(() => undefined);
    if (signal.aborted) return;
    this.log.info({ url: this.urlForLogs, intervalMs: this.intervalMs }, 'egress-IP check started');
    const scheduler = new SlotScheduler({
      clock: this.clock,
      concurrency: this.concurrency,
      run: async (key) => {
        const state = this.states.get(key);
        if (state) await this.guarded(key, state.uid, signal);
      },
    });
    this.scheduler = scheduler;
    scheduler.start();
    const unwatch = this.store.proxies.watch((ev) =>
      this.follow(scheduler, keyOf(ev.object), ev.type === 'DELETED' ? undefined : ev.object),
    );
    try {
      for (const p of this.store.proxies.list()) this.follow(scheduler, keyOf(p), p);
      await new Promise<void>((resolve) => signal.addEventListener('abort', () => resolve(), { once: true }));
    } finally {
      unwatch();
      await scheduler.stop();
      this.scheduler = undefined;
    }
  }

  /**
   * Keeps the schedule of `key` in step with the proxy: checked at its slot every interval
   * while it serves; at once when it has no IP published yet or serves from a new address.
   */
  private follow(scheduler: SlotScheduler, key: string, proxy: ProxyObject | undefined): void {
    let state = this.states.get(key);
    const uid = proxy?.metadata.uid ?? '';
    if (!proxy || (state && state.uid !== uid)) {
      scheduler.delete(key);
      this.states.delete(key);
      state = undefined;
      if (!proxy) return;
    }
    const address = this.skip(proxy) ? undefined : addressKey(proxy);
    // The state outlives a pause in serving, so an instance back at a new address is noticed.
    if (!address) {
      scheduler.delete(key);
      return;
    }
    if (!scheduler.has(key)) {
      const offset = scheduleOffset(uid, this.intervalMs);
      scheduler.add(key, this.intervalMs, nextSlot(this.clock.now(), offset, this.intervalMs));
    }
    if (!state) {
      this.states.set(key, { uid, address });
      if (!proxy.status?.egressIP) scheduler.runNow(key);
    } else if (state.address !== address) {
      state.address = address;
      scheduler.runNow(key);
    }
  }

  /** Checks every serving proxy now (concurrency-capped) and resolves when all are done. */
  async checkOnce(signal: AbortSignal): Promise<EgressCheckSummary> {
    const summary: EgressCheckSummary = { ok: 0, failed: 0, badAnswer: 0, skipped: 0, written: 0 };
    const todo = this.store.proxies
      .list()
      .filter((p) => servingEndpoint(p) && !this.skip(p))
      .map((p) => ({ key: keyOf(p), uid: p.metadata.uid ?? '' }));
    this.oneShot += todo.length;
    // A few workers drain one list: at most `concurrency` checks at once.
    const worker = async () => {
      for (let job = todo.shift(); job; job = todo.shift()) {
        const r = await this.guarded(job.key, job.uid, signal).finally(() => this.oneShot--);
        if (r === 'skipped') summary.skipped++;
        else if (r === 'ok' || r === 'written') summary.ok++;
        else if (r === 'failed') summary.failed++;
        else summary.badAnswer++;
        if (r === 'written') summary.written++;
      }
    };
    await Promise.all(Array.from({ length: Math.min(this.concurrency, todo.length) }, worker));
    return summary;
  }

  /** One check; never rejects (failures are counted and logged inside). */
  private guarded(key: string, uid: string, signal: AbortSignal): Promise<CheckOutcome> {
    return this.checkKey(key, uid, signal).catch((err): CheckOutcome => {
      if (!signal.aborted) this.log.warn({ proxy: key, err }, 'egress-IP check failed');
      return 'failed';
    });
  }

  private stateFor(key: string, uid: string, address: string): TargetState {
    let s = this.states.get(key);
    if (!s || s.uid !== uid) {
      s = { uid, address };
      this.states.set(key, s);
    }
    return s;
  }

  /** One check of one proxy, read fresh from the cache (it may have changed since listing). */
  private async checkKey(key: string, uid: string, signal: AbortSignal): Promise<CheckOutcome> {
    const proxy = this.store.proxies.get(parseKey(key));
    if (!proxy || (proxy.metadata.uid ?? '') !== uid || this.skip(proxy)) return 'skipped';
    const addr = servingEndpoint(proxy);
    if (!addr) return 'skipped';
    // Created here only by checkOnce; an empty address makes a later `run` check at once.
    const state = this.stateFor(key, uid, '');
    let credentials: Credentials | undefined;
    try {
      credentials = await this.credentials.credentialsFor(proxy, { signal });
    } catch (err) {
      if (signal.aborted) return 'skipped';
      this.record(key, state, 'failed', new Error('reading credentials failed', { cause: err }));
      return 'failed';
    }
    if (!credentials && proxyType(proxy.spec) === 'Managed') {
      this.log.debug({ proxy: key }, 'egress-IP check skipped: no credentials yet');
      return 'skipped';
    }
    const answer = await this.fetchIp(
      key,
      state,
      { ...addr, ...(credentials ? { credentials } : {}) },
      signal,
    );
    if ('outcome' in answer) return answer.outcome;
    return this.accept(key, uid, state, proxy, answer.ip, signal);
  }

  /** The IP the URL reports through the proxy, or the outcome that stands instead of one. */
  private async fetchIp(
    key: string,
    state: TargetState,
    target: Parameters<typeof fetchThroughProxy>[0],
    signal: AbortSignal,
  ): Promise<{ ip: string } | { outcome: CheckOutcome }> {
    let ip: string | undefined;
    try {
      const res = await fetchThroughProxy(target, this.url, {
        timeoutMs: this.timeoutMs,
        signal,
        ...(this.ca === undefined ? {} : { ca: this.ca }),
      });
      if (res.status < 200 || res.status > 299) {
        throw new EgressFetchError(`${this.urlForLogs} answered ${res.status}`, res.status);
      }
      ip = parseEgressAnswer(res.body);
    } catch (err) {
      if (signal.aborted) return { outcome: 'skipped' };
      this.record(key, state, 'failed', err);
      return { outcome: 'failed' };
    }
    if (!ip) {
      this.record(
        key,
        state,
        'bad_answer',
        new Error(`${this.urlForLogs} did not answer with an IP address`),
      );
      return { outcome: 'bad_answer' };
    }
    this.record(key, state, 'ok');
    return { ip };
  }

  /** Publishes a good answer and logs a change or a newly shared IP once. */
  private async accept(
    key: string,
    uid: string,
    state: TargetState,
    proxy: ProxyObject,
    ip: string,
    signal: AbortSignal,
  ): Promise<CheckOutcome> {
    const previous = state.ip ?? proxy.status?.egressIP;
    state.ip = ip;
    let written = false;
    try {
      written = await this.publish(key, uid, ip, signal);
    } catch (err) {
      // Not remembered as published: the next check compares with status and writes again.
      if (!signal.aborted) this.log.warn({ proxy: key, err }, 'writing status.egressIP failed');
      state.ip = previous;
      return 'ok';
    }
    if (state.announced !== ip) {
      if (previous !== ip) {
        this.log.info({ proxy: key, egressIP: ip, previous: previous ?? null }, 'proxy egress IP changed');
      }
      const sharedWith = this.sharers(key, ip);
      if (sharedWith.length > 0) {
        this.log.warn(
          { proxy: key, egressIP: ip, sharedWith },
          'egress IP shared with other proxies: they are not independent exits',
        );
      }
      state.announced = ip;
    }
    return written ? 'written' : 'ok';
  }

  private record(key: string, state: TargetState, result: EgressCheckResult, err?: unknown): void {
    this.checks.inc({ result });
    if (result !== 'ok') {
      // Once per run of failures: a dead proxy is already reported by the health engine.
      const level = state.lastResult === result ? 'debug' : 'warn';
      this.log[level]({ proxy: key, result, err }, 'egress-IP check did not yield an IP');
    }
    state.lastResult = result;
  }

  /** Other serving proxies currently known with `ip` (this process's view first). */
  private sharers(key: string, ip: string): string[] {
    const out: string[] = [];
    for (const p of this.store.proxies.list()) {
      const k = keyOf(p);
      if (k === key || !servingEndpoint(p)) continue;
      const s = this.states.get(k);
      const theirs = s && s.uid === (p.metadata.uid ?? '') && s.ip ? s.ip : p.status?.egressIP;
      if (theirs === ip) out.push(k);
    }
    return out.sort();
  }

  /**
   * Writes status.egressIP when it differs, guarded by resourceVersion so no other status
   * field is clobbered; a Conflict re-reads and retries (runtime/retry). Returns whether it
   * wrote; a proxy gone or replaced has nothing to write.
   */
  private async publish(key: string, uid: string, ip: string, signal: AbortSignal): Promise<boolean> {
    const objKey = parseKey(key);
    const write = async (obj: ProxyObject | undefined): Promise<boolean> => {
      if (!obj || (obj.metadata.uid ?? '') !== uid || obj.metadata.deletionTimestamp) return false;
      if (obj.status?.egressIP === ip) return false;
      const rv = obj.metadata.resourceVersion;
      await this.store.proxies.patchStatus(
        objKey,
        { egressIP: ip },
        { signal, ...(rv === undefined ? {} : { resourceVersion: rv }) },
      );
      return true;
    };
    try {
      return await retryOnConflict(
        this.store.proxies.get(objKey),
        write,
        () => this.store.proxies.read(objKey, { signal }),
        { signal },
      );
    } catch (err) {
      if (isNotFound(err)) return false;
      if (!isConflict(err)) throw err;
      this.log.warn({ proxy: key }, 'egress IP not written: the object kept changing (conflicts)');
      return false;
    }
  }
}
