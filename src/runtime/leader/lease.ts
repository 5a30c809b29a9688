/**
 * runtime/leader/lease — leader election on a coordination.k8s.io/v1 Lease with client-go
 * semantics: a holder's claim expires when its record has not changed for leaseDurationSeconds
 * as measured by OUR monotonic clock since we saw it change (clocks of replicas are never
 * compared, and a step of our own wall clock neither extends nor cuts short a deadline);
 * every write is a replace guarded by the read resourceVersion, so a 409 means another replica
 * won; a leader that cannot renew within renewDeadline steps down; a graceful release hands
 * the lease over at once.
 *
 * The leader also publishes where its discovery API answers, in the annotation
 * `crawl.example.com/discovery-url` of the same Lease, written with every acquire and renew (so
 * it can never name a holder other than the one in the spec): standbys forward lease requests
 * there (discovery/authority).
 */
import { randomUUID } from 'node:crypto';
import { hostname } from 'node:os';
import { type CoordinationV1Api, type V1Lease, type V1LeaseSpec, V1MicroTime } from '@kubernetes/client-node';
import { type Logger, silentLogger } from '../../log/index.ts';
import { type Clock, systemClock } from '../clock.ts';
import { callOptions } from '../kube/client.ts';
import { statusCodeOf, toStoreError } from '../kube/errors.ts';
import { clockDeadline } from './deadline.ts';
import type { LeaderCallbacks, LeaderElector } from './elector.ts';

export interface LeaseElectorOptions {
  /** A CoordinationV1Api built by `createKubeClients` (shared connection pool). */
  api: CoordinationV1Api;
  namespace: string;
  /** Lease name, e.g. `egress-proxies-operator-leader`. */
  name: string;
  /** Default: hostname + random suffix (unique per process). */
  identity?: string;
  /** client-go defaults: 15 s / 10 s / 2 s. */
  leaseDurationMs?: number;
  renewDeadlineMs?: number;
  retryPeriodMs?: number;
  /** Acquire attempts wait retryPeriod × (1 + random × jitter); default 1.2 like client-go. */
  jitterFactor?: number;
  clock?: Clock;
  /** Uniform [0, 1) source for the jitter; default Math.random (tests pass a seeded one). */
  random?: () => number;
  log?: Logger;
  /** This replica's discovery API base URL, published while it leads (undefined: not yet known). */
  advertise?: () => string | undefined;
}

export function defaultIdentity(): string {
  return `${hostname()}_${randomUUID()}`;
}

/** Checks the timing relations client-go enforces; throws naming the field. */
export function validateLeaseTimings(o: {
  leaseDurationMs: number;
  renewDeadlineMs: number;
  retryPeriodMs: number;
  jitterFactor: number;
}): void {
  for (const [k, v] of Object.entries(o)) {
    if (!(typeof v === 'number' && Number.isFinite(v) && v >= 0))
      throw new Error(`leader election: ${k} must be >= 0`);
  }
  if (o.retryPeriodMs <= 0) throw new Error('leader election: retryPeriodMs must be > 0');
  if (o.leaseDurationMs <= o.renewDeadlineMs) {
    throw new Error('leader election: leaseDurationMs must be greater than renewDeadlineMs');
  }
  if (o.renewDeadlineMs <= o.jitterFactor * o.retryPeriodMs) {
    throw new Error('leader election: renewDeadlineMs must be greater than jitterFactor × retryPeriodMs');
  }
}

function micro(ms: number): V1MicroTime {
  return new V1MicroTime(ms);
}

/** Re-wraps a time read back from the server (a string) so it serialises with microseconds. */
function asMicro(v: unknown, fallbackMs: number): V1MicroTime {
  const t = v instanceof Date ? v.getTime() : typeof v === 'string' ? Date.parse(v) : Number.NaN;
  return micro(Number.isFinite(t) ? t : fallbackMs);
}

type Attempt = 'acquired' | 'held-by-other' | 'failed';

/** The Lease annotation holding the leader's discovery API base URL. */
export const LEADER_URL_ANNOTATION = 'crawl.example.com/discovery-url';

export class LeaseElector implements LeaderElector {
  readonly identity: string;
  private readonly api: CoordinationV1Api;
  private readonly namespace: string;
  private readonly name: string;
  private readonly leaseDurationMs: number;
  private readonly renewDeadlineMs: number;
  private readonly retryPeriodMs: number;
  private readonly jitterFactor: number;
  private readonly clock: Clock;
  private readonly random: () => number;
  private readonly log: Logger;
  private readonly advertise: () => string | undefined;

  private leading = false;
  /** The last Lease we read or wrote, and when (monotonic) we saw its resourceVersion change. */
  private observed: V1Lease | undefined;
  private observedTime = 0;
  private lastLeader: string | undefined;
  private stopper: AbortController | undefined;
  private loop: Promise<void> | undefined;
  private releasable = false;

  constructor(o: LeaseElectorOptions) {
    if (!o.namespace) throw new Error('leader election: namespace is required');
    if (!o.name) throw new Error('leader election: name is required');
    this.api = o.api;
    this.namespace = o.namespace;
    this.name = o.name;
    this.identity = o.identity ?? defaultIdentity();
    if (!this.identity) throw new Error('leader election: identity must not be empty');
    this.leaseDurationMs = o.leaseDurationMs ?? 15_000;
    this.renewDeadlineMs = o.renewDeadlineMs ?? 10_000;
    this.retryPeriodMs = o.retryPeriodMs ?? 2_000;
    this.jitterFactor = o.jitterFactor ?? 1.2;
    validateLeaseTimings({
      leaseDurationMs: this.leaseDurationMs,
      renewDeadlineMs: this.renewDeadlineMs,
      retryPeriodMs: this.retryPeriodMs,
      jitterFactor: this.jitterFactor,
    });
    this.clock = o.clock ?? systemClock;
    this.random = o.random ?? Math.random;
    this.advertise = o.advertise ?? (() => undefined);
    this.log = (o.log ?? silentLogger()).child({
      lease: `${o.namespace}/${o.name}`,
      identity: this.identity,
    });
  }

  isLeader(): boolean {
    return this.leading;
  }

  /**
   * The current leader's discovery URL as last read from the Lease, while its claim is live by
   * our clock; ours while we lead. Undefined when no live leader has published one.
   */
  leaderAddress(): string | undefined {
    if (this.leading) return this.advertise();
    const lease = this.observed;
    const holder = lease?.spec?.holderIdentity;
    if (!lease || !holder || holder === this.identity) return undefined;
    const durationMs = (lease.spec?.leaseDurationSeconds ?? 0) * 1000;
    if (this.observedTime + durationMs <= this.clock.monotonic()) return undefined;
    return lease.metadata?.annotations?.[LEADER_URL_ANNOTATION] || undefined;
  }

  private annotations(): Record<string, string> | undefined {
    const url = this.advertise();
    return url ? { [LEADER_URL_ANNOTATION]: url } : undefined;
  }

  run(signal: AbortSignal, cb: LeaderCallbacks): Promise<void> {
    if (this.loop) throw new Error('leader election: run() called twice');
    this.stopper = new AbortController();
    const loopSignal = AbortSignal.any([signal, this.stopper.signal]);
    this.loop = this.campaign(loopSignal, cb);
    return this.loop;
  }

  /** Stops renewing, then (if we still hold it) empties the Lease so a peer takes over at once. */
  async release(): Promise<void> {
    this.stopper?.abort();
    await this.loop;
    if (!this.releasable) return;
    this.releasable = false;
    const { signal: deadline, cancel } = clockDeadline(this.clock, this.renewDeadlineMs);
    try {
      await this.releaseBefore(deadline);
    } finally {
      cancel();
    }
  }

  private async releaseBefore(deadline: AbortSignal): Promise<void> {
    // Re-read first: a renew cut short by the stop may still have landed, moving the RV.
    for (let attempt = 0; attempt < 3 && !deadline.aborted; attempt++) {
      try {
        const current = await this.api.readNamespacedLease(
          { namespace: this.namespace, name: this.name },
          callOptions({ signal: deadline }),
        );
        if (current.spec?.holderIdentity !== this.identity) return; // already someone else's
        const now = this.clock.now();
        const spec: V1LeaseSpec = {
          leaseDurationSeconds: 1,
          acquireTime: micro(now),
          renewTime: micro(now),
          leaseTransitions: current.spec?.leaseTransitions ?? 0,
        };
        this.observed = await this.replace(spec, deadline, current.metadata?.resourceVersion);
        this.log.info('released leadership');
        return;
      } catch (e) {
        if (statusCodeOf(e) !== 409) {
          this.log.warn({ err: toStoreError(e, 'lease') }, 'could not release the leader lease');
          return;
        }
      }
    }
  }

  private async campaign(signal: AbortSignal, cb: LeaderCallbacks): Promise<void> {
    this.log.info('campaigning for leadership');
    let lastRenew = 0;
    while (!signal.aborted) {
      lastRenew = this.clock.monotonic();
      const r = await this.tryAcquireOrRenew(signal, this.renewDeadlineMs);
      this.notifyLeader(cb);
      if (r === 'acquired') {
        this.releasable = true; // even if we are stopped right now, hand it back on release()
        break;
      }
      await this.sleep(this.retryPeriodMs * (1 + this.random() * this.jitterFactor), signal);
    }
    if (signal.aborted) return;
    this.leading = true;
    const leadership = new AbortController();
    this.log.info('acquired leadership');
    cb.onStartedLeading(leadership.signal);
    let lost = false;
    while (!signal.aborted) {
      await this.sleep(this.retryPeriodMs, signal);
      if (signal.aborted) break;
      const attemptAt = this.clock.monotonic();
      const left = this.renewDeadlineMs - (attemptAt - lastRenew);
      const r = left > 0 ? await this.tryAcquireOrRenew(signal, left) : 'failed';
      if (signal.aborted) break;
      this.notifyLeader(cb);
      if (r === 'acquired') {
        // Count from the attempt's start: peers time our lease from no earlier than that.
        lastRenew = attemptAt;
        continue;
      }
      if (r === 'held-by-other' || this.clock.monotonic() - lastRenew >= this.renewDeadlineMs) {
        lost = true;
        this.releasable = false;
        this.log.error({ reason: r }, 'failed to renew the leader lease in time; stepping down');
        break;
      }
    }
    this.leading = false;
    leadership.abort();
    if (!lost) this.log.info('stopped leading');
    cb.onStoppedLeading();
  }

  private notifyLeader(cb: LeaderCallbacks): void {
    const holder = this.observed?.spec?.holderIdentity || undefined;
    if (holder && holder !== this.lastLeader) {
      this.lastLeader = holder;
      cb.onNewLeader?.(holder);
    }
  }

  /** One client-go tryAcquireOrRenew: read, judge expiry by our clock, replace with the read RV. */
  private async tryAcquireOrRenew(signal: AbortSignal, timeoutMs: number): Promise<Attempt> {
    const deadline = clockDeadline(this.clock, timeoutMs, signal);
    try {
      return await this.attempt(deadline.signal);
    } finally {
      deadline.cancel();
    }
  }

  private async attempt(reqSignal: AbortSignal): Promise<Attempt> {
    const now = this.clock.now();
    const fresh: V1LeaseSpec = {
      holderIdentity: this.identity,
      leaseDurationSeconds: Math.max(1, Math.ceil(this.leaseDurationMs / 1000)),
      acquireTime: micro(now),
      renewTime: micro(now),
      leaseTransitions: 0,
    };
    let current: V1Lease;
    try {
      current = await this.api.readNamespacedLease(
        { namespace: this.namespace, name: this.name },
        callOptions({ signal: reqSignal }),
      );
    } catch (e) {
      if (statusCodeOf(e) !== 404) return this.failed('reading the leader lease failed', e);
      try {
        const created = await this.api.createNamespacedLease(
          {
            namespace: this.namespace,
            body: {
              apiVersion: 'coordination.k8s.io/v1',
              kind: 'Lease',
              metadata: { name: this.name, namespace: this.namespace, annotations: this.annotations() },
              spec: fresh,
            },
          },
          callOptions({ signal: reqSignal }),
        );
        this.observe(created, this.clock.monotonic());
        return 'acquired';
      } catch (e2) {
        return this.failed('creating the leader lease failed', e2);
      }
    }
    const seenAt = this.clock.monotonic();
    if (current.metadata?.resourceVersion !== this.observed?.metadata?.resourceVersion)
      this.observe(current, seenAt);
    else this.observed = current;
    const spec = current.spec ?? {};
    const holder = spec.holderIdentity || undefined;
    const durationMs = (spec.leaseDurationSeconds ?? fresh.leaseDurationSeconds ?? 0) * 1000;
    if (holder && holder !== this.identity && this.observedTime + durationMs > seenAt) return 'held-by-other';
    const renewing = holder === this.identity;
    const next: V1LeaseSpec = {
      ...fresh,
      acquireTime: renewing ? asMicro(spec.acquireTime, now) : fresh.acquireTime,
      leaseTransitions: renewing ? (spec.leaseTransitions ?? 0) : (spec.leaseTransitions ?? 0) + 1,
    };
    try {
      this.observe(
        await this.replace(next, reqSignal, current.metadata?.resourceVersion),
        this.clock.monotonic(),
      );
      if (!renewing) this.log.info({ previous: holder ?? '(none)' }, 'took over the leader lease');
      return 'acquired';
    } catch (e) {
      return this.failed(
        renewing ? 'renewing the leader lease failed' : 'acquiring the leader lease failed',
        e,
      );
    }
  }

  private observe(lease: V1Lease, at: number): void {
    this.observed = lease;
    this.observedTime = at;
  }

  /** A full replace: annotations are rewritten too (none when `spec` has no holder). */
  private replace(spec: V1LeaseSpec, signal: AbortSignal, resourceVersion?: string): Promise<V1Lease> {
    return this.api.replaceNamespacedLease(
      {
        namespace: this.namespace,
        name: this.name,
        body: {
          apiVersion: 'coordination.k8s.io/v1',
          kind: 'Lease',
          metadata: {
            name: this.name,
            namespace: this.namespace,
            resourceVersion: resourceVersion ?? this.observed?.metadata?.resourceVersion,
            ...(spec.holderIdentity === this.identity ? { annotations: this.annotations() } : {}),
          },
          spec,
        },
      },
      callOptions({ signal }),
    );
  }

  private failed(what: string, e: unknown): Attempt {
    const code = statusCodeOf(e);
    if (code === 409) this.log.debug('lost a race for the leader lease (409)');
    else this.log.warn({ err: toStoreError(e, 'lease') }, what);
    return 'failed';
  }

  private sleep(ms: number, signal: AbortSignal): Promise<void> {
    return new Promise((resolve) => {
      if (signal.aborted) return resolve();
      const t = this.clock.setTimeout(done, ms);
      const clock = this.clock;
      function done() {
        clock.clearTimeout(t);
        signal.removeEventListener('abort', done);
        resolve();
      }
      signal.addEventListener('abort', done, { once: true });
    });
  }
}
