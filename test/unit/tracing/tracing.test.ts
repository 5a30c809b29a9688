import { createServer } from 'node:http';
import { Writable } from 'node:stream';
import { gunzipSync } from 'node:zlib';
import { context, INVALID_SPAN_CONTEXT, SpanStatusCode, trace } from '@opentelemetry/api';
import { InMemorySpanExporter } from '@opentelemetry/sdk-trace';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { redactUrl } from '../../../src/api/url.ts';
import { createLogger } from '../../../src/log/index.ts';
import { closeServer, listenOn } from '../../../src/metrics/bind.ts';
import { permanent } from '../../../src/provider/errors.ts';
import { batchOptionsFromEnv, setupTracing, type Tracing, withSpan } from '../../../src/tracing/index.ts';
import { setupTestTracing } from '../../support/tracing.ts';

let active: Tracing | undefined;
afterEach(async () => {
  await active?.shutdown();
  active = undefined;
  vi.unstubAllEnvs();
});

/** A logger writing JSON lines into an array. */
function captureLogs(): {
  log: ReturnType<typeof createLogger>;
  lines: () => Array<Record<string, unknown>>;
} {
  const chunks: string[] = [];
  const destination = new Writable({
    write(chunk: Buffer, _enc, cb) {
      chunks.push(chunk.toString());
      cb();
    },
  });
  const log = createLogger({ pretty: false, destination, level: 'info' });
  return {
    log,
    lines: () =>
      chunks
        .join('')
        .split('\n')
        .filter(Boolean)
        .map((l) => JSON.parse(l) as Record<string, unknown>),
  };
}

describe('setupTracing', () => {
  it('is a no-op without an OTLP endpoint: nothing recorded, logs carry no trace ids', async () => {
    active = setupTracing({ serviceName: 'svc', env: {} });
    expect(active.enabled).toBe(false);
    const { log, lines } = captureLogs();
    await withSpan(active.tracer, 'reconcile', {}, (span) => {
      expect(span.isRecording()).toBe(false);
      log.info('inside');
    });
    expect(lines()[0]).not.toHaveProperty('trace_id');
    expect(lines()[0]).not.toHaveProperty('span_id');
  });

  it('honours OTEL_SDK_DISABLED even with an endpoint', () => {
    active = setupTracing({
      serviceName: 'svc',
      env: { OTEL_SDK_DISABLED: 'true', OTEL_EXPORTER_OTLP_ENDPOINT: 'http://127.0.0.1:1' },
    });
    expect(active.enabled).toBe(false);
    expect(setupTracing({ serviceName: 'svc', env: { OTEL_EXPORTER_OTLP_ENDPOINT: ' ' } }).enabled).toBe(
      false,
    );
  });

  it('nests spans through async work and stamps log lines with the active trace and span', async () => {
    const t = setupTestTracing();
    active = t;
    const { log, lines } = captureLogs();
    log.info('before');
    await withSpan(t.tracer, 'reconcile', { 'proxy.name': 'eu-1' }, async () => {
      log.info('in reconcile');
      await new Promise((r) => setTimeout(r, 5));
      await withSpan(t.tracer, 'provider.get', {}, async () => {
        await Promise.resolve();
        log.info('in provider call');
      });
    });
    log.info('after');

    const outer = t.span('reconcile');
    const inner = t.span('provider.get');
    expect(outer.attributes['proxy.name']).toBe('eu-1');
    expect(inner.parentSpanContext?.spanId).toBe(outer.spanContext().spanId);
    expect(inner.spanContext().traceId).toBe(outer.spanContext().traceId);

    const [before, inReconcile, inProvider, after] = lines();
    expect(before).not.toHaveProperty('trace_id');
    expect(inReconcile).toMatchObject({
      trace_id: outer.spanContext().traceId,
      span_id: outer.spanContext().spanId,
    });
    expect(inProvider).toMatchObject({
      trace_id: inner.spanContext().traceId,
      span_id: inner.spanContext().spanId,
    });
    expect(after).not.toHaveProperty('trace_id');
  });

  it('leaves invalid (all-zero) span contexts out of log lines', () => {
    active = setupTestTracing();
    const { log, lines } = captureLogs();
    const invalid = trace.setSpan(context.active(), trace.wrapSpanContext(INVALID_SPAN_CONTEXT));
    context.with(invalid, () => log.info('under a no-op span'));
    expect(lines()[0]).not.toHaveProperty('trace_id');
  });

  it('withSpan records a failure, ends the span and rethrows the same error', async () => {
    const t = setupTestTracing();
    active = t;
    const ours = permanent('machine type e2-huge does not exist');
    await expect(
      withSpan(t.tracer, 'gc.sweep', {}, () => {
        throw ours;
      }),
    ).rejects.toBe(ours);
    const foreign = new Error('connect ECONNREFUSED http://user:s3cret@10.0.0.1');
    await expect(withSpan(t.tracer, 'health.probe', {}, () => Promise.reject(foreign))).rejects.toBe(foreign);

    const sweep = t.span('gc.sweep');
    expect(sweep.ended).toBe(true);
    expect(sweep.status.code).toBe(SpanStatusCode.ERROR);
    expect(sweep.events[0]?.attributes?.['exception.message']).toBe('machine type e2-huge does not exist');
    const probe = t.span('health.probe');
    expect(probe.status.code).toBe(SpanStatusCode.ERROR);
    expect(JSON.stringify(probe.events)).not.toContain('s3cret');
  });

  it('logs collector URLs without embedded credentials', () => {
    expect(redactUrl('https://user:key@collector.example:4318/v1/traces?api_key=k#x')).toBe(
      'https://collector.example:4318/v1/traces',
    );
    expect(redactUrl('not a url')).toBe('(unparsable URL)');
  });

  it('reads OTEL_BSP_* batch settings and ignores bad ones', () => {
    expect(
      batchOptionsFromEnv({
        OTEL_BSP_SCHEDULE_DELAY: '200',
        OTEL_BSP_MAX_QUEUE_SIZE: '100',
        OTEL_BSP_MAX_EXPORT_BATCH_SIZE: '512',
        OTEL_BSP_EXPORT_TIMEOUT: 'soon',
      }),
    ).toEqual({ scheduledDelayMillis: 200, maxQueueSize: 100, maxExportBatchSize: 100 });
  });

  it('honours OTEL_TRACES_SAMPLER=always_off', async () => {
    const exporter = new InMemorySpanExporter();
    active = setupTracing({ serviceName: 'svc', exporter, env: { OTEL_TRACES_SAMPLER: 'always_off' } });
    await withSpan(active.tracer, 'reconcile', {}, () => {});
    expect(exporter.getFinishedSpans()).toHaveLength(0);
  });

  it('exports over OTLP/HTTP to the endpoint and headers named by OTEL_* variables', async () => {
    const received: Array<{ url?: string; auth?: string; body: string }> = [];
    const collector = createServer((req, res) => {
      const parts: Buffer[] = [];
      req.on('data', (c: Buffer) => parts.push(c));
      req.on('end', () => {
        let raw = Buffer.concat(parts);
        if (req.headers['content-encoding'] === 'gzip') raw = gunzipSync(raw);
        received.push({
          url: req.url,
          auth: req.headers['x-collector-key'] as string,
          body: raw.toString('latin1'),
        });
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end('{}');
      });
    });
    const { port } = await listenOn(collector, { host: '127.0.0.1', port: 0 });
    try {
      vi.stubEnv('OTEL_EXPORTER_OTLP_TRACES_ENDPOINT', `http://127.0.0.1:${port}/v1/traces`);
      vi.stubEnv('OTEL_EXPORTER_OTLP_HEADERS', 'x-collector-key=k1');
      vi.stubEnv('OTEL_SERVICE_NAME', 'proxy-operator-test');
      active = setupTracing({ serviceName: 'svc', env: process.env });
      expect(active.enabled).toBe(true);
      await withSpan(active.tracer, 'providerhealth.check', {}, () => {});
      await active.shutdown();
      expect(received).toHaveLength(1);
      expect(received[0]!.url).toBe('/v1/traces');
      expect(received[0]!.auth).toBe('k1');
      expect(received[0]!.body).toContain('providerhealth.check');
      expect(received[0]!.body).toContain('proxy-operator-test');
    } finally {
      await closeServer(collector);
    }
    // After shutdown the global provider is released: the API hands out no-op spans again.
    const after = trace.getTracer('any').startSpan('x');
    expect(after.isRecording()).toBe(false);
    after.end();
  });
});
