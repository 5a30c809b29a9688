/**
 * A health-check URL with userinfo and a query key (`http://user:pass@host/x?key=…`): a real
 * probe run (real Squid, real HTTP origin, the real probe, the health engine) and a scrape of
 * the real /metrics endpoint show the URL only redacted — the password and the key appear in no
 * log line, no metric label, no span and no status written to the store.
 */
import { InMemorySpanExporter, SimpleSpanProcessor, TracerProvider } from '@opentelemetry/sdk-trace';
import { Registry } from 'prom-client';
import { afterAll, beforeAll, expect, it, vi } from 'vitest';
import { CONDITION_HEALTHY } from '../../../src/api/constants.ts';
import { HealthEngine } from '../../../src/health/engine.ts';
import { startMetricsServer } from '../../../src/metrics/server.ts';
import { createMemoryStore } from '../../../src/runtime/memory.ts';
import { captureLog } from '../../support/log.ts';
import { type Origin, startHttpOrigin } from '../../support/origins.ts';
import { type Squid, startSquid } from '../../support/squid.ts';

let squid: Squid;
let origin: Origin;

beforeAll(async () => {
  [squid, origin] = await Promise.all([startSquid(), startHttpOrigin()]);
});

afterAll(async () => {
  await Promise.all([squid?.stop(), origin?.close()]);
});

const URL_PASSWORD = 'UrlPassw0rd-in-healthcheck';
const URL_KEY = 'QueryKey-in-healthcheck';

it('a health-check URL with userinfo is redacted in logs, /metrics, spans and status', async () => {
  const store = createMemoryStore();
  store.seedSecret({
    metadata: { name: 'creds', namespace: 'crawl' },
    stringData: { username: squid.username, password: squid.password },
  });
  const url = `http://probe:${URL_PASSWORD}@127.0.0.1:${origin.port}/status/204?key=${URL_KEY}`;
  store.seedProxy({
    metadata: { name: 'p', namespace: 'crawl' },
    spec: {
      type: 'External',
      endpoint: { host: squid.host, port: squid.port },
      credentialsSecretRef: { name: 'creds' },
      healthCheck: { url, expectStatus: 204, intervalSeconds: 1 },
    },
  });
  const captured = captureLog('debug');
  const registry = new Registry();
  const exporter = new InMemorySpanExporter();
  const tracer = new TracerProvider({ spanProcessors: [new SimpleSpanProcessor({ exporter })] }).getTracer(
    't',
  );
  const engine = new HealthEngine({ store, registry, logger: captured.log, tracer, traceProbes: true });
  const metrics = await startMetricsServer({ bindAddress: '127.0.0.1:0', registry });
  engine.start();
  try {
    const healthy = () =>
      store.proxies
        .get({ namespace: 'crawl', name: 'p' })
        ?.status?.conditions?.find((c) => c.type === CONDITION_HEALTHY);
    await vi.waitFor(() => expect(healthy()?.status).toBe('True'), { timeout: 10_000, interval: 50 });
    const scrape = async () => (await fetch(`http://127.0.0.1:${metrics?.port}/metrics`)).text();
    await vi.waitFor(async () => expect(await scrape()).toContain('proxy_operator_healthcheck_target_up{'), {
      timeout: 10_000,
      interval: 50,
    });
    const text = await scrape();
    // The URL is still told apart, by its redacted form.
    expect(text).toContain(
      `proxy_operator_healthcheck_target_up{url="http://127.0.0.1:${origin.port}/status/204"} 1`,
    );
    const everything = [
      text,
      ...captured.raw,
      JSON.stringify(store.proxies.list().map((p) => p.status)),
      JSON.stringify(exporter.getFinishedSpans().map((s) => s.attributes)),
    ].join('\n');
    expect(captured.raw.join('\n')).toContain(`127.0.0.1:${origin.port}/status/204`);
    for (const secret of [URL_PASSWORD, URL_KEY, squid.password]) {
      const at = everything.indexOf(secret);
      expect(at, everything.slice(Math.max(0, at - 300), at + 50)).toBe(-1);
    }
    expect(origin.requests).toBeGreaterThan(0);
  } finally {
    await engine.stop();
    await metrics?.close();
  }
});
