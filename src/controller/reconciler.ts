/**
 * controller/reconciler — the Proxy controller: one `reconcile(key)` per work-queue item,
 * reading like the state table in docs/architecture.md ("The Proxy state machine"), and the
 * watch sources that enqueue keys. The steps live beside it: managed (provision, inputs,
 * cleanup), deletion, external, and the one status writer. A throw goes back to the queue
 * (backoff; a RetryAfterError asks for a fixed delay); `requeueAfter` polls. A Conflict is
 * not retried here: the next pass starts from a fresh read, as in controller-runtime.
 *
 * Crash safety rests on three things: the finalizer and the spec-hash annotation are written
 * before anything is created; the instance name is a function of (UID, spec-hash) and create
 * is idempotent by name, so a lost status write re-finds the same instance; and a replaced
 * instance is recorded in status.retiring before it is deleted.
 */
import { type Span, SpanStatusCode, type Tracer, trace } from '@opentelemetry/api';
import { type Counter, type Histogram, Registry } from 'prom-client';
import { keyOf, parseKey } from '../api/meta.ts';
import { type ProxyObject, proxyType } from '../api/proxy.ts';
import { errorMessage } from '../log/errors.ts';
import { type Logger, silentLogger } from '../log/index.ts';
import { counter, histogram } from '../metrics/register.ts';
import { type Clock, systemClock } from '../runtime/clock.ts';
import { type CredentialsResolver, createCredentialsResolver } from '../runtime/credentials.ts';
import { deepEqual } from '../runtime/patch.ts';
import { isNotFound, type ObjectStore, type Unsubscribe, type WatchEvent } from '../runtime/store.ts';
import {
  type ProviderLookup,
  type ReconcileContext,
  type ReconcileResult,
  type ReconcilerOptions,
  resolveOptions,
} from './context.ts';
import { reconcileDeletion } from './deletion.ts';
import { reconcileExternal } from './external.ts';
import { reconcileManaged } from './managed.ts';
import { DEFAULT_SURGE_LIMIT, type SurgeLimit, SurgeLimiter } from './surge.ts';

export {
  type ProviderLookup,
  ReconcileError,
  type ReconcileResult,
  type ReconcilerOptions,
} from './context.ts';

export { DEFAULT_SURGE_LIMIT, parseSurgeLimit, type SurgeLimit } from './surge.ts';

export interface ProxyReconcilerDeps {
  store: ObjectStore;
  providers: ProviderLookup;
  log?: Logger;
  registry?: Registry;
  clock?: Clock;
  /** Default: the global tracer provider's `egress-proxies-operator/controller` tracer. */
  tracer?: Tracer;
  /** Default: a resolver of its own on `store`. */
  credentials?: CredentialsResolver;
  /**
   * This operator's installation id (cluster: the kube-system namespace UID; standalone: kept
   * beside the state file; or --installation-id): labels every instance, keys the spec-hash.
   */
  installation: string;
  options?: ReconcilerOptions;
  /** Replacements in flight per provider at once. Default 10 % of its Proxies, at least 1. */
  maxConcurrentReplacements?: SurgeLimit;
  /**
   * Live leases granted on instance `providerID` of Proxy `key` — the lease store of this
   * process; a drain waits for them. Default: none (a replaced instance drains at once).
   */
  leasesOn?: (key: string, providerID: string) => number;
}

export interface ProxyReconciler {
  /** Reconcile one `namespace/name`. Throws to ask for a retry with backoff. */
  reconcile(key: string, signal: AbortSignal): Promise<ReconcileResult>;
  /** Subscribe to everything that should trigger a reconcile; returns the unsubscribe. */
  watchSources(enqueue: (key: string) => void): Unsubscribe;
}

/** True when a watch event carries something the reconciler acts on (not a status-only write). */
export function needsReconcile(event: WatchEvent<ProxyObject>): boolean {
  if (event.type !== 'MODIFIED' || !event.old) return true;
  const a = event.old;
  const b = event.object;
  return (
    a.metadata.uid !== b.metadata.uid ||
    a.metadata.generation !== b.metadata.generation ||
    a.metadata.deletionTimestamp !== b.metadata.deletionTimestamp ||
    !deepEqual(a.metadata.annotations ?? {}, b.metadata.annotations ?? {}) ||
    !deepEqual(a.metadata.finalizers ?? [], b.metadata.finalizers ?? []) ||
    !deepEqual(a.spec, b.spec) ||
    // The health engine passed (or failed) a replacement: the switch waits for this.
    !deepEqual(a.status?.replacementHealth ?? null, b.status?.replacementHealth ?? null)
  );
}

/** One pass of the state machine: fetch, then the External, Deleting or Managed rows. */
async function reconcileProxy(ctx: ReconcileContext): Promise<ReconcileResult> {
  let p: ProxyObject;
  try {
    p = await ctx.store.proxies.read(ctx.key, { signal: ctx.signal });
  } catch (err) {
    if (isNotFound(err)) {
      ctx.surge.forget(keyOf({ metadata: { namespace: ctx.key.namespace, name: ctx.key.name } }));
      return {}; // Proxy gone: nothing
    }
    throw err;
  }
  if (proxyType(p.spec) === 'External') return reconcileExternal(ctx, p);
  if (p.metadata.deletionTimestamp) return reconcileDeletion(ctx, p);
  return reconcileManaged(ctx, p);
}

interface Metrics {
  total: Counter<'result'>;
  duration: Histogram;
  lost: Counter<'provider'>;
}

function metrics(registry: Registry): Metrics {
  return {
    total: counter(registry, {
      name: 'proxy_operator_reconcile_total',
      help: 'Proxy reconciles by result (success, requeue, error).',
      labelNames: ['result'],
    }),
    duration: histogram(registry, {
      name: 'proxy_operator_reconcile_duration_seconds',
      help: 'Time one Proxy reconcile took.',
      buckets: [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 15, 60],
    }),
    lost: counter(registry, {
      name: 'proxy_operator_instances_lost_total',
      help: 'Instances that vanished or terminated while their Proxy expected them; each is recreated.',
      labelNames: ['provider'],
    }),
  };
}

export function createProxyReconciler(deps: ProxyReconcilerDeps): ProxyReconciler {
  const { store, providers } = deps;
  const log = deps.log ?? silentLogger();
  const clock = deps.clock ?? systemClock;
  const m = metrics(deps.registry ?? new Registry());
  const tracer = deps.tracer ?? trace.getTracer('egress-proxies-operator/controller');
  const credentials = deps.credentials ?? createCredentialsResolver(store, { clock });
  const options = resolveOptions(deps.options);
  if (!deps.installation) throw new Error('createProxyReconciler: installation is required');
  const surge = new SurgeLimiter(store.proxies, deps.maxConcurrentReplacements ?? DEFAULT_SURGE_LIMIT);
  const leasesOn = deps.leasesOn ?? (() => 0);

  function context(key: string, signal: AbortSignal): ReconcileContext {
    const runLog = log.child({ proxy: key });
    return {
      key: parseKey(key),
      signal,
      log: runLog,
      call: { signal, log: runLog },
      store,
      providers,
      credentials,
      installation: deps.installation,
      options,
      now: () => new Date(clock.now()).toISOString(),
      nowMs: () => clock.now(),
      surge,
      leasesOn,
      countLost: (provider) => m.lost.inc({ provider }),
    };
  }

  async function reconcile(key: string, signal: AbortSignal): Promise<ReconcileResult> {
    const started = clock.now();
    const ctx = context(key, signal);
    return tracer.startActiveSpan(
      'reconcile',
      { attributes: { 'proxy.namespace': ctx.key.namespace ?? '', 'proxy.name': ctx.key.name } },
      async (span: Span) => {
        try {
          const res = await reconcileProxy(ctx);
          // The periodic re-check of a Ready instance is not a pending poll.
          const polling = res.requeueAfter !== undefined && res.requeueAfter !== options.readyResyncMs;
          m.total.inc({ result: polling ? 'requeue' : 'success' });
          return res;
        } catch (err) {
          m.total.inc({ result: 'error' });
          span.setStatus({ code: SpanStatusCode.ERROR, message: errorMessage(err) });
          ctx.log.debug({ err }, 'reconcile failed');
          throw err;
        } finally {
          m.duration.observe((clock.now() - started) / 1000);
          span.end();
        }
      },
    );
  }

  function watchSources(enqueue: (key: string) => void): Unsubscribe {
    surge.setEnqueue(enqueue);
    const offProxies = store.proxies.watch((ev) => {
      if (ev.type !== 'DELETED' && needsReconcile(ev)) enqueue(keyOf(ev.object));
    });
    // A Secret event requeues the Proxies that read it (cloud-init or credentials).
    const offSecrets = store.secrets.watch((ev) => {
      for (const p of credentials.proxiesUsingSecret(keyOf(ev.object))) enqueue(keyOf(p));
    });
    return () => {
      surge.setEnqueue(undefined);
      offProxies();
      offSecrets();
    };
  }

  return { reconcile, watchSources };
}
