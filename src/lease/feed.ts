/**
 * lease/feed — keeps the lease store in step with the Proxy objects: every Proxy event becomes
 * an upsert/remove of its lease-relevant facts (address, phase, Healthy condition, drain,
 * deletion, maxLeases, labels, location, a problem only a person can fix, the instance it serves from and
 * the replaced ones draining) with the credentials its serving instance actually has (its
 * credentials generation, api/served-credentials; else the credentials Secret); a change to a
 * Secret re-resolves the proxies that use it. Health verdicts come from the health engine.
 */

import { findCondition, isConditionTrue } from '../api/conditions.ts';
import { CONDITION_HEALTHY, CONDITION_PROVISIONED, PROVISIONED_REASONS } from '../api/constants.ts';
import type { Credentials } from '../api/credentials.ts';
import { keyOf, parseKey } from '../api/meta.ts';
import { type ProxyObject, proxyType, servingEndpoint } from '../api/proxy.ts';
import { proxyOfServedSecret, servedCredentials } from '../api/served-credentials.ts';
import { type Logger, silentLogger } from '../log/index.ts';
import { type Clock, systemClock, type TimerHandle } from '../runtime/clock.ts';
import { type CredentialsResolver, createCredentialsResolver } from '../runtime/credentials.ts';
import type { ObjectStore, Unsubscribe } from '../runtime/store.ts';
import type { LeaseStore } from './store.ts';
import type { ProxyInfo, ProxyProblem } from './types.ts';

/**
 * Provisioned reasons that wait for a person (a Secret to create or fix, a provider to put back
 * in the config): the proxy stays unserved, or on its old spec, however often it is reconciled.
 */
const NEEDS_A_PERSON = new Set<string>([
  PROVISIONED_REASONS.credentials,
  PROVISIONED_REASONS.cloudInit,
  PROVISIONED_REASONS.providerNotConfigured,
]);

/** The problem a Proxy's Provisioned condition reports, when only a person can fix it. */
export function proxyProblem(p: ProxyObject): ProxyProblem | undefined {
  const c = findCondition(p.status?.conditions, CONDITION_PROVISIONED);
  if (c?.status !== 'False' || !NEEDS_A_PERSON.has(c.reason ?? '')) return undefined;
  return { reason: c.reason ?? '', message: c.message ?? '' };
}

export interface LeaseFeedOptions {
  store: ObjectStore;
  leases: LeaseStore;
  log?: Logger;
  signal: AbortSignal;
  /** Delay before re-reading credentials after a failed read. Default 2000 ms. */
  retryMs?: number;
  clock?: Clock;
  /** Default: a resolver of its own on `store`, closed when the feed stops. */
  credentials?: CredentialsResolver;
}

export interface LeaseFeed {
  stop(): void;
  /** Resolves once pending watch events are handled and no credential lookup is in flight. */
  idle(): Promise<void>;
}

/**
 * The lease-relevant facts of a Proxy. Host and port are where it serves (api/proxy
 * `servingEndpoint`); a proxy serving nowhere gets none, and the lease store refuses it.
 */
export function proxyInfo(p: ProxyObject, credentials: Credentials | undefined): ProxyInfo {
  const endpoint = servingEndpoint(p);
  const info: ProxyInfo = {
    key: keyOf(p),
    namespace: p.metadata.namespace ?? '',
    name: p.metadata.name,
    uid: p.metadata.uid ?? '',
    labels: p.metadata.labels ?? {},
    phase: p.status?.phase ?? 'Pending',
    healthy: isConditionTrue(p.status?.conditions, CONDITION_HEALTHY),
    draining: p.spec.drain === true,
    deleting: p.metadata.deletionTimestamp !== undefined,
    maxLeases: p.spec.maxLeases ?? 0,
    host: endpoint?.host ?? '',
    port: endpoint?.port ?? 0,
  };
  if (credentials) info.credentials = credentials;
  const s = p.status;
  if (proxyType(p.spec) === 'Managed' && s?.providerID) info.instance = s.providerID;
  const draining = (s?.draining ?? []).filter((d) => d.address);
  if (draining.length > 0 && !info.deleting) {
    info.drainingInstances = draining.map((d) => ({
      providerID: d.providerID,
      host: d.address ?? '',
      port: d.port ?? endpoint?.port ?? 0,
      since: d.since,
    }));
  }
  const problem = proxyProblem(p);
  if (problem) info.problem = problem;
  if (s?.egressIP) info.egressIP = s.egressIP;
  if (s?.location) info.location = s.location;
  const latency = p.status?.health?.latencyMillis;
  if (latency !== undefined) info.latencyMillis = latency;
  return info;
}

/**
 * What the feed logs about a proxy, each thing once: a Proxy event repeats the same facts many
 * times, the log should not.
 */
class FeedLog {
  private readonly warnedNoCredentials = new Set<string>();
  private readonly readFailing = new Set<string>();
  /** The problem last logged per proxy. */
  private readonly loggedProblem = new Map<string, string>();

  private readonly log: Logger;

  constructor(log: Logger) {
    this.log = log;
  }

  /** Once per failure streak at warn; the retries every few seconds at debug. */
  readFailed(key: string, err: unknown): void {
    if (this.readFailing.has(key))
      this.log.debug({ proxy: key, err }, 'reading proxy credentials failed again');
    else this.log.warn({ proxy: key, err }, 'reading proxy credentials failed; retrying');
    this.readFailing.add(key);
  }

  credentialsRead(key: string, p: ProxyObject, creds: Credentials | undefined): void {
    this.readFailing.delete(key);
    if (creds) {
      this.warnedNoCredentials.delete(key);
      return;
    }
    if (proxyType(p.spec) !== 'Managed') return;
    // A new proxy has no Secret until the reconciler generates it: normal, not worth a warning
    // until the proxy serves (then its lease URLs would really go out without credentials).
    if (!servingEndpoint(p)) this.log.debug({ proxy: key }, 'managed proxy has no credentials Secret yet');
    else if (!this.warnedNoCredentials.has(key)) {
      this.warnedNoCredentials.add(key);
      this.log.warn(
        { proxy: key },
        'managed proxy serves but has no credentials Secret; its lease URLs carry no credentials',
      );
    }
  }

  problem(key: string, problem: ProxyProblem | undefined): void {
    const said = this.loggedProblem.get(key);
    if (!problem) {
      if (said === undefined) return;
      this.loggedProblem.delete(key);
      this.log.info({ proxy: key }, 'proxy problem resolved');
      return;
    }
    const text = `${problem.reason}: ${problem.message}`;
    if (said === text) return;
    this.loggedProblem.set(key, text);
    this.log.warn({ proxy: key, reason: problem.reason, message: problem.message }, 'proxy needs attention');
  }

  forget(key: string): void {
    this.warnedNoCredentials.delete(key);
    this.loggedProblem.delete(key);
    this.readFailing.delete(key);
  }
}

export function startLeaseFeed(opts: LeaseFeedOptions): LeaseFeed {
  const { store, leases, signal } = opts;
  const log = opts.log ?? silentLogger();
  const retryMs = opts.retryMs ?? 2000;
  const clock = opts.clock ?? systemClock;
  const ownResolver = opts.credentials === undefined;
  const credentials = opts.credentials ?? createCredentialsResolver(store, { clock });
  /** Latest event generation per proxy key: an older lookup finishing late is dropped. */
  const generation = new Map<string, number>();
  const inflight = new Set<Promise<void>>();
  const timers = new Set<TimerHandle>();
  const said = new FeedLog(log);
  let stopped = false;

  const sync = (p: ProxyObject): void => {
    if (stopped) return;
    const key = keyOf(p);
    const gen = (generation.get(key) ?? 0) + 1;
    generation.set(key, gen);
    const run = (async () => {
      let creds: Credentials | undefined;
      try {
        // What the serving instance was created with; a rotated Secret is for its replacement.
        creds =
          (proxyType(p.spec) === 'Managed'
            ? servedCredentials(store.secrets, p, p.status?.credentialsGeneration)
            : undefined) ?? (await credentials.credentialsFor(p, { signal }));
      } catch (err) {
        if (stopped || generation.get(key) !== gen) return;
        said.readFailed(key, err);
        const t = clock.setTimeout(() => {
          timers.delete(t);
          const latest = store.proxies.get(parseKey(key));
          if (latest && generation.get(key) === gen) sync(latest);
        }, retryMs);
        timers.add(t);
        return;
      }
      if (stopped || generation.get(key) !== gen) return;
      said.credentialsRead(key, p, creds);
      const info = proxyInfo(p, creds);
      said.problem(key, info.problem);
      leases.upsertProxy(info);
    })();
    inflight.add(run);
    void run.finally(() => inflight.delete(run));
  };

  const remove = (p: ProxyObject): void => {
    const key = keyOf(p);
    generation.set(key, (generation.get(key) ?? 0) + 1);
    said.forget(key);
    leases.removeProxy(key);
  };

  const unsubs: Unsubscribe[] = [];
  unsubs.push(
    store.proxies.watch((ev) => {
      if (ev.type === 'DELETED') remove(ev.object);
      else sync(ev.object);
    }),
  );
  unsubs.push(
    store.secrets.watch((ev) => {
      for (const p of credentials.proxiesUsingSecret(keyOf(ev.object))) sync(p);
      const owner = proxyOfServedSecret(ev.object);
      const p = owner && store.proxies.get(owner);
      if (p) sync(p);
    }),
  );
  // Watches replay existing objects on most backends; listing too is harmless (upserts are idempotent).
  for (const p of store.proxies.list()) sync(p);

  const stop = () => {
    if (stopped) return;
    stopped = true;
    for (const u of unsubs) u();
    for (const t of timers) clock.clearTimeout(t);
    timers.clear();
    if (ownResolver) credentials.close();
  };
  signal.addEventListener('abort', stop, { once: true });
  if (signal.aborted) stop();

  return {
    stop,
    async idle() {
      // Watch events may be delivered on a later tick; let them arrive first.
      for (;;) {
        await new Promise<void>((resolve) => setImmediate(resolve));
        if (inflight.size === 0) return;
        await Promise.allSettled([...inflight]);
      }
    },
  };
}
