import { InMemorySpanExporter, SimpleSpanProcessor, TracerProvider } from '@opentelemetry/sdk-trace';
import { describe, expect, it } from 'vitest';
import { LABEL_CLOUD_INIT_SECRET } from '../../src/api/constants.ts';
import { createLogger } from '../../src/log/index.ts';
import { createHarness, NS } from './harness.ts';

describe('reconciler observability', () => {
  it('counts reconciles by result, times them and opens one reconcile span per call', async () => {
    const exporter = new InMemorySpanExporter();
    const provider = new TracerProvider({ spanProcessors: [new SimpleSpanProcessor({ exporter })] });
    const h = await createHarness({ fake: { pendingGets: 1 }, deps: { tracer: provider.getTracer('t') } });
    await h.seed('eu-1');
    await h.reconcile('eu-1'); // requeue (Provisioning)
    h.fake.markRunning(h.proxy('eu-1')!.status!.providerID!);
    await h.reconcile('eu-1'); // success (Ready)
    h.fake.fail('get', { errorClass: 'Transient' });
    await h.attempt('eu-1'); // error

    const total = await h.registry.getSingleMetric('proxy_operator_reconcile_total')!.get();
    const by = Object.fromEntries(total.values.map((v) => [v.labels.result, v.value]));
    expect(by).toEqual({ requeue: 1, success: 1, error: 1 });
    const duration = await h.registry.getSingleMetric('proxy_operator_reconcile_duration_seconds')!.get();
    expect(
      duration.values.find((v) => (v as { metricName?: string }).metricName?.endsWith('_count'))?.value,
    ).toBe(3);

    const spans = exporter.getFinishedSpans();
    expect(spans.map((s) => s.name)).toEqual(['reconcile', 'reconcile', 'reconcile']);
    expect(spans[0]!.attributes).toMatchObject({ 'proxy.namespace': NS, 'proxy.name': 'eu-1' });
    expect(spans[2]!.status.code).toBe(2); // ERROR
  });

  it('never logs, traces or writes into status the credentials or the cloud-init content', async () => {
    const lines: string[] = [];
    const log = createLogger({
      level: 'trace',
      destination: { write: (s: string) => lines.push(s) > 0 } as unknown as NodeJS.WritableStream,
    });
    const exporter = new InMemorySpanExporter();
    const provider = new TracerProvider({ spanProcessors: [new SimpleSpanProcessor({ exporter })] });
    const h = await createHarness({ deps: { log, tracer: provider.getTracer('t') } });
    const secretInit = 'CLOUD-INIT-SECRET-MARKER';
    await h.seedSecret({
      metadata: { name: 'init', namespace: NS, labels: { [LABEL_CLOUD_INIT_SECRET]: 'true' } },
      data: { 'user-data': Buffer.from(secretInit).toString('base64') },
    });
    await h.seed('eu-1', { cloudInit: { secretRef: { name: 'init', key: 'user-data' } } });
    await h.reconcile('eu-1');
    const password = h.fake.byName(h.proxy('eu-1')!.status!.instanceName!)!.request.credentials.password;
    h.fake.fail('get', { errorClass: 'QuotaExceeded' });
    await h.attempt('eu-1');
    h.fake.clearFaults();
    const p = h.proxy('eu-1')!;
    h.fake.loseInstance(p.status!.providerID!);
    await h.reconcile('eu-1');
    await h.store.proxies.delete({ namespace: NS, name: 'eu-1' });
    await h.reconcile('eu-1');
    await h.reconcile('eu-1');
    expect(h.proxy('eu-1')).toBeUndefined();

    expect(password.length).toBeGreaterThan(20);
    const everything = [
      ...lines,
      JSON.stringify(p.status),
      ...exporter.getFinishedSpans().map((s) => JSON.stringify({ a: s.attributes, st: s.status, n: s.name })),
    ].join('\n');
    expect(lines.length).toBeGreaterThan(0);
    expect(everything).not.toContain(secretInit);
    expect(everything).not.toContain(password);
  });
});
