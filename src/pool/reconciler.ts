/**
 * pool/reconciler — the ProxyPool controller (leader only): one `reconcile(key)` per pool per
 * work-queue item. It reads the pool's Proxies from the cache, asks pool/plan what to do, and
 * does it — creates Proxies from the template, marks victims draining (`spec.drain` and the
 * drain-since annotation, so the lease store stops granting them), deletes drained ones, asks
 * aged Proxies for an in-place restart under rotation `strategy: Restart` (spec.drain and the
 * restart-requested annotation; controller/restart does the restart) and lifts the drain once
 * they passed their health checks again — then writes the pool's status. The Proxy controller does everything else for each Proxy; a
 * deleted pool's Proxies go through ownerReference garbage collection.
 */

import { setCondition } from '../api/conditions.ts';
import { ANNOTATION_POOL_DRAIN_SINCE, ANNOTATION_RESTART_REQUESTED, LABEL_POOL } from '../api/constants.ts';
import { keyOf, parseKey } from '../api/meta.ts';
import type { ProxyObject } from '../api/proxy.ts';
import { desiredReplicas, type ProxyPool, rollingLimits } from '../api/proxypool.ts';
import { type Logger, silentLogger } from '../log/index.ts';
import { type Clock, systemClock } from '../runtime/clock.ts';
import { deepEqual } from '../runtime/patch.ts';
import { retryOnConflict } from '../runtime/retry.ts';
import { isAlreadyExists, isNotFound, type ObjectStore, type Unsubscribe } from '../runtime/store.ts';
import { type Member, memberOf } from './members.ts';
import { planPool } from './plan.ts';
import { poolSelector, poolStatus } from './status.ts';
import { memberName, memberProxy, ownedBy, templateHash } from './template.ts';

export const DEFAULT_POOL_DRAIN_TIMEOUT_MS = 10 * 60_000;
export const DEFAULT_POOL_DRAIN_POLL_MS = 5_000;
/** Creations in flight at once: enough to fill a large pool quickly, few enough for the API server. */
const CREATE_CONCURRENCY = 32;

export interface PoolReconcilerDeps {
  store: ObjectStore;
  log?: Logger;
  clock?: Clock;
  /** Draws the name suffixes; default Math.random (tests seed it). */
  random?: () => number;
  /** Live leases on instance `providerID` of Proxy `key` (the leader's lease store). */
  leasesOn?: (key: string, providerID: string) => number;
  /** A configured provider's type, for the `strategy: Restart` message; undefined when not configured. */
  providerType?: (name: string) => string | undefined;
  /**
   * Whether a configured provider can give a running instance a new IP in place (the provider
   * registry's canRestart); undefined when not configured. Default: none can.
   */
  canRestart?: (name: string) => boolean | undefined;
  /** A draining Proxy is deleted at the latest this long after its drain began (--drain-timeout). */
  drainTimeoutMs?: number;
  drainPollMs?: number;
}

export interface PoolReconciler {
  reconcile(key: string, signal: AbortSignal): Promise<{ requeueAfter?: number }>;
  watchSources(enqueue: (key: string) => void): Unsubscribe;
}

/**
 * Why the pool's spec cannot be acted on here, naming the field; undefined when it can. Rotation
 * `strategy: Restart` needs a provider that can give a running instance a new IP in place (the
 * provider contract's `restart`: gcp) and room for a Proxy to be unavailable meanwhile.
 */
export function unsupportedSpec(
  pool: ProxyPool,
  providerType: (name: string) => string | undefined,
  canRestart: (name: string) => boolean | undefined = () => false,
): string | undefined {
  if (pool.spec.rotation?.strategy !== 'Restart') return undefined;
  if (rollingLimits(pool.spec).maxUnavailable < 1) {
    return 'spec.rollingUpdate.maxUnavailable: must be at least 1 with rotation.strategy Restart (a Proxy being restarted serves nothing)';
  }
  const provider = pool.spec.template.spec.provider ?? '';
  const type = providerType(provider);
  if (type !== undefined && canRestart(provider) === true) return undefined;
  const which =
    type === undefined
      ? `provider "${provider}" is not configured`
      : `provider "${provider}" (type ${type}) cannot give a running instance a new IP`;
  return `spec.rotation.strategy: Restart is not supported: ${which}; use strategy Replace (a new Proxy per rotation)`;
}

/**
 * Rewrites member `m` with `change` (given a copy of the current object; it returns false to
 * leave it as it is), re-reading and trying again on a Conflict.
 */
async function updateMember(
  store: ObjectStore,
  m: Member,
  signal: AbortSignal,
  change: (next: ProxyObject) => boolean,
): Promise<void> {
  await retryOnConflict(
    m.proxy,
    async (p: ProxyObject) => {
      if (p.metadata.deletionTimestamp) return;
      const next = structuredClone(p);
      if (change(next)) await store.proxies.update(next, { signal });
    },
    () => store.proxies.read(parseKey(m.key), { signal }),
    { signal },
  );
}

/** Asks `m` for an in-place restart: no new leases (spec.drain), and the request's time. */
function requestRestart(store: ObjectStore, m: Member, sinceIso: string, signal: AbortSignal): Promise<void> {
  return updateMember(store, m, signal, (next) => {
    const a = next.metadata.annotations ?? {};
    if (a[ANNOTATION_RESTART_REQUESTED] || a[ANNOTATION_POOL_DRAIN_SINCE]) return false;
    next.spec.drain = true;
    next.metadata.annotations = { ...a, [ANNOTATION_RESTART_REQUESTED]: sinceIso };
    return true;
  });
}

/** A restarted `m` passed its health checks: the drain is lifted (back to the template's). */
function resumeMember(store: ObjectStore, pool: ProxyPool, m: Member, signal: AbortSignal): Promise<void> {
  return updateMember(store, m, signal, (next) => {
    const a = next.metadata.annotations ?? {};
    if (!a[ANNOTATION_RESTART_REQUESTED] || a[ANNOTATION_POOL_DRAIN_SINCE]) return false;
    const { [ANNOTATION_RESTART_REQUESTED]: _done, ...rest } = a;
    next.metadata.annotations = rest;
    if (pool.spec.template.spec.drain === undefined) delete next.spec.drain;
    else next.spec.drain = pool.spec.template.spec.drain;
    return true;
  });
}

/** Stops new leases on `m` (spec.drain) and records when, so it is deleted once drained. */
function startDrain(store: ObjectStore, m: Member, sinceIso: string, signal: AbortSignal): Promise<void> {
  return updateMember(store, m, signal, (next) => {
    if (next.metadata.annotations?.[ANNOTATION_POOL_DRAIN_SINCE]) return false;
    next.spec.drain = true;
    next.metadata.annotations = {
      ...(next.metadata.annotations ?? {}),
      [ANNOTATION_POOL_DRAIN_SINCE]: sinceIso,
    };
    return true;
  });
}

/** Deletes a drained pool Proxy (its finalizer deletes the instance first). */
async function removeMember(store: ObjectStore, m: Member, signal: AbortSignal): Promise<void> {
  try {
    await store.proxies.delete(parseKey(m.key), { signal, uid: m.proxy.metadata.uid ?? '' });
  } catch (err) {
    if (!isNotFound(err)) throw err;
  }
}

/** Pool events, and every event of a pool's Proxy, enqueue the pool. */
function watchPoolSources(store: ObjectStore, enqueue: (key: string) => void): Unsubscribe {
  const offPools = store.proxyPools.watch((ev) => {
    if (ev.type === 'DELETED') return;
    const a = ev.old;
    const b = ev.object;
    // The pool's own status writes are no reason to look again.
    if (
      a &&
      a.metadata.generation === b.metadata.generation &&
      a.metadata.deletionTimestamp === b.metadata.deletionTimestamp
    ) {
      return;
    }
    enqueue(keyOf(b));
  });
  // Any change to a pool's Proxy (ready, healthy, drained, gone) may let the pool move on.
  const offProxies = store.proxies.watch((ev) => {
    const pool = ev.object.metadata.labels?.[LABEL_POOL];
    if (pool && ev.object.metadata.namespace) enqueue(`${ev.object.metadata.namespace}/${pool}`);
  });
  return () => {
    offPools();
    offProxies();
  };
}

export function createPoolReconciler(deps: PoolReconcilerDeps): PoolReconciler {
  const { store } = deps;
  const log = deps.log ?? silentLogger();
  const clock = deps.clock ?? systemClock;
  const random = deps.random ?? Math.random;
  const leasesOn = deps.leasesOn ?? (() => 0);
  const providerType = deps.providerType ?? (() => undefined);
  const canRestart = deps.canRestart ?? (() => false);
  const drainTimeoutMs = deps.drainTimeoutMs ?? DEFAULT_POOL_DRAIN_TIMEOUT_MS;
  const drainPollMs = deps.drainPollMs ?? DEFAULT_POOL_DRAIN_POLL_MS;

  function membersOf(pool: ProxyPool): Member[] {
    const inputs = { templateHash: templateHash(pool.spec.template), rotation: pool.spec.rotation, leasesOn };
    return store.proxies
      .list({ namespace: pool.metadata.namespace, labelSelector: poolSelector(pool.metadata.name) })
      .filter((p) => ownedBy(p, pool))
      .map((p) => memberOf(p, inputs));
  }

  async function createOne(pool: ProxyPool, hash: string, signal: AbortSignal): Promise<void> {
    for (let attempt = 0; ; attempt++) {
      const name = memberName(pool.metadata.name, random);
      if (store.proxies.get({ namespace: pool.metadata.namespace, name })) continue;
      try {
        await store.proxies.create(memberProxy(pool, name, hash), { signal });
        return;
      } catch (err) {
        if (!isAlreadyExists(err) || attempt >= 5) throw err;
      }
    }
  }

  async function createMany(pool: ProxyPool, n: number, signal: AbortSignal): Promise<void> {
    const hash = templateHash(pool.spec.template);
    for (let done = 0; done < n; done += CREATE_CONCURRENCY) {
      const batch = Math.min(CREATE_CONCURRENCY, n - done);
      await Promise.all(Array.from({ length: batch }, () => createOne(pool, hash, signal)));
    }
  }

  async function writeStatus(
    pool: ProxyPool,
    invalid: string | undefined,
    signal: AbortSignal,
  ): Promise<void> {
    const { status, conditions } = poolStatus({
      pool,
      members: membersOf(pool),
      replicas: desiredReplicas(pool.spec),
      maxUnavailable: rollingLimits(pool.spec).maxUnavailable,
      nowMs: clock.now(),
      invalid,
      restartInPlace: pool.spec.rotation?.strategy === 'Restart',
    });
    const now = new Date(clock.now()).toISOString().replace(/\.\d+Z$/, 'Z');
    let merged = pool.status?.conditions;
    for (const c of conditions) merged = setCondition(merged, c, now);
    const next = { ...(pool.status ?? {}), ...status, conditions: merged ?? [] };
    if (deepEqual(next, pool.status ?? {})) return;
    try {
      await store.proxyPools.patchStatus(parseKey(keyOf(pool)), next, { signal });
    } catch (err) {
      if (!isNotFound(err)) throw err;
    }
  }

  async function reconcile(key: string, signal: AbortSignal): Promise<{ requeueAfter?: number }> {
    const pool = store.proxyPools.get(parseKey(key));
    if (!pool || pool.metadata.deletionTimestamp) return {};
    const runLog = log.child({ pool: key });
    const invalid = unsupportedSpec(pool, providerType, canRestart);
    if (invalid !== undefined) {
      runLog.warn({ reason: invalid }, 'pool spec cannot be acted on; nothing changes');
      await writeStatus(pool, invalid, signal);
      return {};
    }
    const limits = rollingLimits(pool.spec);
    const plan = planPool({
      members: membersOf(pool),
      replicas: desiredReplicas(pool.spec),
      ...limits,
      nowMs: clock.now(),
      drainTimeoutMs,
      drainPollMs,
      restartInPlace: pool.spec.rotation?.strategy === 'Restart',
    });
    const since = new Date(clock.now()).toISOString();
    for (const m of plan.drain) await startDrain(store, m, since, signal);
    for (const m of plan.remove) await removeMember(store, m, signal);
    for (const m of plan.restart) await requestRestart(store, m, since, signal);
    for (const m of plan.resume) await resumeMember(store, pool, m, signal);
    if (plan.create > 0) await createMany(pool, plan.create, signal);
    const changes =
      plan.drain.length + plan.remove.length + plan.create + plan.restart.length + plan.resume.length;
    if (changes > 0) {
      runLog.info(
        {
          created: plan.create,
          draining: plan.drain.map((m) => m.proxy.metadata.name),
          deleted: plan.remove.map((m) => m.proxy.metadata.name),
          restarting: plan.restart.map((m) => m.proxy.metadata.name),
          restarted: plan.resume.map((m) => m.proxy.metadata.name),
        },
        'pool changed',
      );
    }
    await writeStatus(pool, undefined, signal);
    return plan.requeueAfterMs !== undefined ? { requeueAfter: plan.requeueAfterMs } : {};
  }

  return { reconcile, watchSources: (enqueue) => watchPoolSources(store, enqueue) };
}
