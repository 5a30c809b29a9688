/**
 * tracing — OpenTelemetry setup for the whole process (tracer provider, async context, W3C
 * propagation, OTLP export from the standard OTEL_* variables) plus the few helpers every
 * component uses to make spans without leaking secrets into them.
 */

import {
  type Attributes,
  type Context,
  context,
  propagation,
  type Span,
  SpanStatusCode,
  type Tracer,
  trace,
} from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import { W3CTraceContextPropagator } from '@opentelemetry/core';
import { OTLPTraceExporter } from '@opentelemetry/exporter-trace-otlp-http';
import {
  defaultResource,
  detectResources,
  envDetector,
  resourceFromAttributes,
} from '@opentelemetry/resources';
import {
  AlwaysOffSampler,
  AlwaysOnSampler,
  BatchSpanProcessor,
  ParentBasedSampler,
  type Sampler,
  SimpleSpanProcessor,
  type SpanExporter,
  type SpanProcessor,
  TraceIdRatioBasedSampler,
  TracerProvider,
} from '@opentelemetry/sdk-trace';
import type { Logger } from 'pino';
import { redactUrl } from '../api/url.ts';
import { silentLogger } from '../log/index.ts';
import { ProviderError } from '../provider/errors.ts';
import { StoreError } from '../runtime/store.ts';

export const TRACER_NAME = 'egress-proxies-operator';

export interface TracingOptions {
  /** `service.name` unless OTEL_SERVICE_NAME overrides it. */
  serviceName: string;
  serviceVersion?: string;
  log?: Logger;
  /** Defaults to process.env; tests pass their own. */
  env?: Record<string, string | undefined>;
  /**
   * Export to this exporter instead of OTLP (tests: InMemorySpanExporter). Spans are then
   * exported synchronously as they end, and tracing is on regardless of OTEL_EXPORTER_* vars.
   */
  exporter?: SpanExporter;
}

export interface Tracing {
  tracer: Tracer;
  /** true when spans are recorded and exported; false = the API's no-op tracer. */
  enabled: boolean;
  /** Flushes pending spans and unregisters the global provider, context manager and propagator. */
  shutdown(): Promise<void>;
}

const truthy = (v: string | undefined): boolean => v !== undefined && /^(true|1|yes)$/i.test(v.trim());

/** Whether the OTEL_* environment asks for export at all. */
export function otlpConfigured(env: Record<string, string | undefined>): boolean {
  if (truthy(env.OTEL_SDK_DISABLED)) return false;
  if ((env.OTEL_TRACES_EXPORTER ?? '').trim().toLowerCase() === 'none') return false;
  return Boolean(env.OTEL_EXPORTER_OTLP_ENDPOINT?.trim() || env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT?.trim());
}

/**
 * The sampler named by OTEL_TRACES_SAMPLER / OTEL_TRACES_SAMPLER_ARG (the SDK 3.x no longer reads
 * them itself). Default parentbased_always_on; an unknown name falls back to it with a warning.
 */
export function samplerFromEnv(
  env: Record<string, string | undefined>,
  log: Logger = silentLogger(),
): Sampler {
  const name = (env.OTEL_TRACES_SAMPLER ?? 'parentbased_always_on').trim().toLowerCase();
  const ratio = (): number => {
    const raw = env.OTEL_TRACES_SAMPLER_ARG;
    const n = raw === undefined || raw.trim() === '' ? 1 : Number(raw);
    if (!Number.isFinite(n) || n < 0 || n > 1) {
      log.warn({ value: raw }, 'OTEL_TRACES_SAMPLER_ARG must be a number in [0, 1]; using 1');
      return 1;
    }
    return n;
  };
  switch (name) {
    case 'always_on':
      return new AlwaysOnSampler();
    case 'always_off':
      return new AlwaysOffSampler();
    case 'traceidratio':
      return new TraceIdRatioBasedSampler(ratio());
    case 'parentbased_always_off':
      return new ParentBasedSampler({ root: new AlwaysOffSampler() });
    case 'parentbased_traceidratio':
      return new ParentBasedSampler({ root: new TraceIdRatioBasedSampler(ratio()) });
    case 'parentbased_always_on':
      return new ParentBasedSampler({ root: new AlwaysOnSampler() });
    default:
      log.warn({ value: name }, 'unknown OTEL_TRACES_SAMPLER; using parentbased_always_on');
      return new ParentBasedSampler({ root: new AlwaysOnSampler() });
  }
}

/** OTEL_BSP_* batch settings (the SDK 3.x no longer reads them itself); bad values are ignored. */
export function batchOptionsFromEnv(
  env: Record<string, string | undefined>,
  log: Logger = silentLogger(),
): {
  scheduledDelayMillis?: number;
  maxQueueSize?: number;
  maxExportBatchSize?: number;
  exportTimeoutMillis?: number;
} {
  const vars = {
    scheduledDelayMillis: 'OTEL_BSP_SCHEDULE_DELAY',
    maxQueueSize: 'OTEL_BSP_MAX_QUEUE_SIZE',
    maxExportBatchSize: 'OTEL_BSP_MAX_EXPORT_BATCH_SIZE',
    exportTimeoutMillis: 'OTEL_BSP_EXPORT_TIMEOUT',
  } as const;
  const out: Record<string, number> = {};
  for (const [key, name] of Object.entries(vars)) {
    const raw = env[name]?.trim();
    if (!raw) continue;
    const n = Number(raw);
    if (Number.isInteger(n) && n > 0) out[key] = n;
    else log.warn({ variable: name, value: raw }, 'ignoring OTEL_BSP_* value: want a positive integer');
  }
  if (out.maxExportBatchSize !== undefined && out.maxQueueSize !== undefined) {
    out.maxExportBatchSize = Math.min(out.maxExportBatchSize, out.maxQueueSize);
  }
  return out;
}

/**
 * Installs tracing for the process. Without an OTLP endpoint (or with OTEL_SDK_DISABLED=true)
 * nothing is registered: the returned tracer is the API's no-op one, which costs nothing and
 * opens no connection.
 */
export function setupTracing(opts: TracingOptions): Tracing {
  const env = opts.env ?? process.env;
  const log = opts.log ?? silentLogger();
  if (truthy(env.OTEL_SDK_DISABLED) || (!opts.exporter && !otlpConfigured(env))) {
    log.debug('tracing off: no OTEL_EXPORTER_OTLP_ENDPOINT / OTEL_EXPORTER_OTLP_TRACES_ENDPOINT');
    return { tracer: trace.getTracer(TRACER_NAME), enabled: false, shutdown: async () => {} };
  }

  const processor: SpanProcessor = opts.exporter
    ? new SimpleSpanProcessor({ exporter: opts.exporter })
    : // The exporter reads endpoint, headers, timeout and compression from OTEL_EXPORTER_OTLP_*.
      new BatchSpanProcessor({ exporter: new OTLPTraceExporter(), ...batchOptionsFromEnv(env, log) });

  const resource = defaultResource()
    .merge(
      resourceFromAttributes({
        'service.name': opts.serviceName,
        ...(opts.serviceVersion ? { 'service.version': opts.serviceVersion } : {}),
      }),
    )
    // OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES (read from process.env) win over ours.
    .merge(detectResources({ detectors: [envDetector] }));

  const provider = new TracerProvider({
    resource,
    sampler: samplerFromEnv(env, log),
    spanProcessors: [processor],
  });
  const contextManager = new AsyncLocalStorageContextManager().enable();
  // Registration fails only when something else registered first; keep theirs, drop ours.
  if (!context.setGlobalContextManager(contextManager)) contextManager.disable();
  propagation.setGlobalPropagator(new W3CTraceContextPropagator());
  if (!trace.setGlobalTracerProvider(provider)) {
    log.warn('another OpenTelemetry tracer provider is already registered; using ours only directly');
  }
  log.info(
    {
      endpoint: opts.exporter
        ? 'in-process'
        : redactUrl(env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT || env.OTEL_EXPORTER_OTLP_ENDPOINT || ''),
    },
    'tracing on: exporting spans over OTLP/HTTP',
  );

  let done: Promise<void> | undefined;
  return {
    // Straight from our provider, so spans work even if another provider was registered globally.
    tracer: provider.getTracer(TRACER_NAME, opts.serviceVersion),
    enabled: true,
    shutdown() {
      done ??= (async () => {
        try {
          await provider.shutdown();
        } catch (err) {
          log.warn({ err }, 'flushing spans at shutdown failed');
        } finally {
          trace.disable();
          propagation.disable();
          context.disable();
        }
      })();
      return done;
    },
  };
}

/**
 * Errors whose messages we write ourselves and keep free of secrets; any other error's message
 * (an SDK's, a socket's) may echo a URL with credentials or a request body, so only its name goes
 * into a span.
 */
export function hasSafeMessage(err: unknown): err is Error {
  return err instanceof ProviderError || err instanceof StoreError;
}

function safeErrorSummary(err: unknown): { name: string; message?: string } {
  if (hasSafeMessage(err)) return { name: err.name, message: err.message };
  return { name: err instanceof Error ? err.name : typeof err };
}

/**
 * Marks a span failed: status ERROR with `errorClass` (or the error's name) as its description
 * and an exception event — with the message only for errors we know carry no secrets.
 */
export function recordSpanError(span: Span, err: unknown, errorClass?: string): void {
  const summary = safeErrorSummary(err);
  span.recordException(
    summary.message === undefined ? { name: summary.name } : { name: summary.name, message: summary.message },
  );
  if (errorClass) span.setAttribute('error.type', errorClass);
  span.setStatus({ code: SpanStatusCode.ERROR, message: errorClass ?? summary.name });
}

/**
 * Runs `fn` inside an active span (child of the current context): errors are recorded and
 * rethrown unchanged, and the span always ends.
 */
export async function withSpan<T>(
  tracer: Tracer,
  name: string,
  attributes: Attributes,
  fn: (span: Span) => Promise<T> | T,
  parent?: Context,
): Promise<T> {
  return tracer.startActiveSpan(name, { attributes }, parent ?? context.active(), async (span) => {
    try {
      return await fn(span);
    } catch (err) {
      recordSpanError(span, err);
      throw err;
    } finally {
      span.end();
    }
  });
}
