/**
 * provider/decorators — wrap a Provider so every call is counted, timed and traced, and every
 * failure is attributed to the provider, without the provider knowing. Order, inside out:
 * metrics, tracing, error origin (see `withErrorOrigin`). The wrappers expose only
 * the Provider contract: in particular never `check`, so health checks (collected from the raw
 * providers) can never be counted as provider requests.
 */
import { type Attributes, context, type Span, type Tracer } from '@opentelemetry/api';
import type { Counter, Histogram, Registry } from 'prom-client';
import { counter, histogram } from '../metrics/register.ts';
import { recordSpanError } from '../tracing/index.ts';
import type { CallContext, CreateRequest, Instance, Provider } from './contract.ts';
import { asProviderError, classify, type ErrorClass } from './errors.ts';

export const PROVIDER_OPS = ['create', 'get', 'delete', 'listByTag', 'adopt', 'restart'] as const;
export type ProviderOp = (typeof PROVIDER_OPS)[number];
export type ProviderResult = 'ok' | ErrorClass;

export const PROVIDER_REQUESTS_TOTAL = 'proxy_operator_provider_requests_total';
export const PROVIDER_REQUEST_DURATION = 'proxy_operator_provider_request_duration_seconds';

/** Provider calls range from a cached get (ms) to a create that downloads an image (minutes). */
const DURATION_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300];

export interface ProviderMetrics {
  requests: Counter<'provider' | 'op' | 'result'>;
  duration: Histogram<'provider' | 'op'>;
}

/** The provider request metrics on `registry`, registered on first use and shared afterwards. */
export function providerMetrics(registry: Registry): ProviderMetrics {
  return {
    requests: counter(registry, {
      name: PROVIDER_REQUESTS_TOTAL,
      help: 'Provider API calls by provider, operation and result (ok or the error class).',
      labelNames: ['provider', 'op', 'result'],
    }),
    duration: histogram(registry, {
      name: PROVIDER_REQUEST_DURATION,
      help: 'Duration of provider API calls in seconds, whatever their result.',
      labelNames: ['provider', 'op'],
      buckets: DURATION_BUCKETS,
    }),
  };
}

/** The call shape both decorators intercept. */
type Around = <T>(
  op: ProviderOp,
  attrs: Attributes,
  call: () => Promise<T>,
  onResult?: (v: T, span?: Span) => void,
) => Promise<T>;

/** A Provider whose operations (and close) go through `around`; name/type copied. */
function decorate(p: Provider, around: Around): Provider {
  const adopt = p.adopt?.bind(p);
  const restart = p.restart?.bind(p);
  return {
    name: p.name,
    type: p.type,
    create: (ctx: CallContext, req: CreateRequest) =>
      around(
        'create',
        { 'provider.instance_name': req.name },
        () => p.create(ctx, req),
        (inst: Instance, span) => span?.setAttribute('provider.id', inst.id),
      ),
    get: (ctx: CallContext, providerID: string) =>
      around('get', { 'provider.id': providerID }, () => p.get(ctx, providerID)),
    delete: (ctx: CallContext, providerID: string) =>
      around('delete', { 'provider.id': providerID }, () => p.delete(ctx, providerID)),
    listByTag: (ctx: CallContext) =>
      around(
        'listByTag',
        {},
        () => p.listByTag(ctx),
        (list: Instance[], span) => span?.setAttribute('provider.instances', list.length),
      ),
    // Only where the backend can relabel: callers test for the method's presence.
    ...(adopt && {
      adopt: (ctx: CallContext, providerID: string, installation: string) =>
        around('adopt', { 'provider.id': providerID }, () => adopt(ctx, providerID, installation)),
    }),
    // Only where the backend can change an instance's IP in place (contract canRestart).
    ...(restart && {
      restart: (ctx: CallContext, providerID: string, since: Date) =>
        around(
          'restart',
          { 'provider.id': providerID },
          () => restart(ctx, providerID, since),
          (inst: Instance, span) => span?.setAttribute('provider.instance_state', inst.state),
        ),
    }),
    close: async () => {
      await p.close?.();
    },
  };
}

/**
 * Counts every call in `proxy_operator_provider_requests_total{provider,op,result}` (result = ok
 * or the error's class) and observes its duration. Errors propagate unchanged.
 */
export function withMetrics(p: Provider, metrics: ProviderMetrics): Provider {
  return decorate(p, async (op, _attrs, call) => {
    const endTimer = metrics.duration.startTimer({ provider: p.name, op });
    let result: ProviderResult = 'ok';
    try {
      return await call();
    } catch (err) {
      result = classify(err);
      throw err;
    } finally {
      endTimer();
      metrics.requests.inc({ provider: p.name, op, result });
    }
  });
}

/**
 * One span per call, `provider.<op>`, child of the caller's active context, carrying the provider
 * name/type and the instance ID or name — never request bodies, credentials or cloud-init. A
 * failure sets status ERROR with the error class; errors propagate unchanged.
 */
export function withTracing(p: Provider, tracer: Tracer): Provider {
  return decorate(p, (op, attrs, call, onResult) =>
    tracer.startActiveSpan(
      `provider.${op}`,
      { attributes: { 'provider.name': p.name, 'provider.type': p.type, 'provider.op': op, ...attrs } },
      context.active(),
      async (span) => {
        try {
          const value = await call();
          onResult?.(value, span);
          return value;
        } catch (err) {
          const errorClass = classify(err);
          span.setAttribute('provider.error_class', errorClass);
          recordSpanError(span, err, errorClass);
          throw err;
        } finally {
          span.end();
        }
      },
    ),
  );
}

/** Providers made by `withErrorOrigin`, and the one made for each provider it was given. */
const attributed = new WeakSet<Provider>();
const attributedFor = new WeakMap<Provider, Provider>();

/**
 * Every throw of `p` becomes a ProviderError (see `asProviderError`), so a caller tells the
 * provider's failures from its own: a store or network error on the caller's side is never
 * the provider's verdict on an instance. Apply it outermost: tracing trusts ProviderError
 * messages, and a foreign message wrapped here must not reach a span. Idempotent: a provider
 * it made is returned as is, and one provider always gets the same wrapper.
 */
export function withErrorOrigin(p: Provider): Provider {
  if (attributed.has(p)) return p;
  const known = attributedFor.get(p);
  if (known) return known;
  const wrapped = decorate(p, async (op, attrs, call) => {
    try {
      return await call();
    } catch (err) {
      const id = attrs['provider.id'];
      throw asProviderError(err, {
        op,
        provider: p.name,
        ...(typeof id === 'string' ? { providerID: id } : {}),
      });
    }
  });
  attributed.add(wrapped);
  attributedFor.set(p, wrapped);
  return wrapped;
}
