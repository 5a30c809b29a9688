import { InMemorySpanExporter, SimpleSpanProcessor, TracerProvider } from '@opentelemetry/sdk-trace';
import { describe, expect, it } from 'vitest';
import { LABEL_CLOUD_INIT_SECRET } from '../../../src/api/constants.ts';
import { createHarness, NS } from '../../support/controller/harness.ts';
import { captureLog } from '../../support/log.ts';

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

  it('logs exactly one line per phase change, at warn for Failed, that a person can follow', async () => {
    const { log, lines } = captureLog('trace');
    const h = await createHarness({ fake: { pendingGets: 1 }, deps: { log } });
    const changes = () =>
      lines
        .filter((l) => l.msg === 'proxy phase changed')
        .map((l) => ({ level: l.level, from: l.from, to: l.to, proxy: l.proxy, reason: l.reason }));

    await h.seed('eu-1');
    await h.reconcile('eu-1'); // Provisioning
    await h.reconcile('eu-1'); // still Provisioning: no line
    const first = h.proxy('eu-1')!.status!.providerID!;
    h.fake.markRunning(first);
    await h.reconcile('eu-1'); // Ready
    await h.reconcile('eu-1'); // nothing changes: no line
    const ready = lines.find((l) => l.msg === 'proxy phase changed' && l.to === 'Ready');
    expect(ready).toMatchObject({ proxy: `${NS}/eu-1`, providerID: first, address: expect.any(String) });

    // A spec change: Replacing while the new instance starts, then Ready on it.
    h.fake.pendingGets = 1;
    const cur = h.proxy('eu-1')!;
    await h.store.proxies.update({ ...cur, spec: { ...cur.spec, placement: { zone: 'z2' } } });
    await h.reconcile('eu-1');
    const fresh = [...h.fake.instances.values()].find((i) => i.id !== first)!;
    h.fake.markRunning(fresh.id);
    await h.reconcile('eu-1');
    const switched = lines.filter((l) => l.msg === 'proxy phase changed').at(-1);
    expect(switched).toMatchObject({
      from: 'Replacing',
      to: 'Ready',
      providerID: fresh.id,
      previousProviderID: first,
    });

    // A permanent error on the next spec change: the old instance keeps serving (Ready), and
    // one warn line says why the edit did not happen.
    h.fake.fail('create', { errorClass: 'Permanent', message: 'machine type "huge" does not exist' });
    const p = h.proxy('eu-1')!;
    await h.store.proxies.update({
      ...p,
      spec: { ...p.spec, placement: { zone: 'z2', machineType: 'huge' } },
    });
    await h.reconcile('eu-1');
    await h.reconcile('eu-1'); // held: no second line
    const held = lines.filter((l) => l.level === 40);
    expect(held).toHaveLength(1);
    expect(held[0]).toMatchObject({
      msg: 'spec change failed for good; the serving instance stays',
      reason: 'ProvisioningFailed',
      message: 'machine type "huge" does not exist',
    });

    // A proxy with nothing serving fails: Failed, at warn, with the reason and message.
    await h.seed('eu-2', { placement: { machineType: 'huge' } });
    await h.reconcile('eu-2');
    await h.reconcile('eu-2'); // still Failed: no second line
    const failed = lines.filter((l) => l.to === 'Failed');
    expect(failed).toHaveLength(1);
    expect(failed[0]).toMatchObject({
      level: 40,
      proxy: `${NS}/eu-2`,
      reason: 'ProvisioningFailed',
      message: 'machine type "huge" does not exist',
    });
    // Each failure is said once: no separate warn line repeats it.
    expect(lines.filter((l) => l.level === 40)).toHaveLength(2);

    const info = 30;
    const warn = 40;
    expect(changes()).toEqual([
      { level: info, from: 'Pending', to: 'Provisioning', proxy: `${NS}/eu-1`, reason: 'Provisioning' },
      { level: info, from: 'Provisioning', to: 'Ready', proxy: `${NS}/eu-1`, reason: 'InstanceRunning' },
      { level: info, from: 'Ready', to: 'Replacing', proxy: `${NS}/eu-1`, reason: 'InstanceRunning' },
      { level: info, from: 'Replacing', to: 'Ready', proxy: `${NS}/eu-1`, reason: 'InstanceRunning' },
      { level: warn, from: 'Pending', to: 'Failed', proxy: `${NS}/eu-2`, reason: 'ProvisioningFailed' },
    ]);
  });

  it('logs a switch to a new instance that never passed through Replacing', async () => {
    const { log, lines } = captureLog('info');
    const h = await createHarness({ deps: { log } });
    await h.seed('eu-1');
    await h.reconcile('eu-1');
    const first = h.proxy('eu-1')!.status!.providerID!;
    const cur = h.proxy('eu-1')!;
    await h.store.proxies.update({ ...cur, spec: { ...cur.spec, placement: { zone: 'z2' } } });
    await h.reconcile('eu-1'); // the replacement is Running at once
    const now = h.proxy('eu-1')!.status!;
    expect(now.phase).toBe('Ready');
    expect(lines.filter((l) => l.msg === 'proxy switched to a new instance')).toEqual([
      expect.objectContaining({ providerID: now.providerID, previousProviderID: first, phase: 'Ready' }),
    ]);
  });

  it('never logs, traces or writes into status the credentials or the cloud-init content', async () => {
    const { log, raw: lines } = captureLog('trace');
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
