import { SpanStatusCode } from '@opentelemetry/api';
import { type Histogram, Registry } from 'prom-client';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import type { TargetCheck } from '../../../src/api/providerhealth.ts';
import { notFound, permanent, quotaExceeded, transient } from '../../../src/provider/errors.ts';
import {
  type CallContext,
  type CreateRequest,
  type Instance,
  isChecker,
  type Provider,
  ProviderError,
  providerMetrics,
  providerRegistryFrom,
  withErrorOrigin,
  withMetrics,
  withTracing,
} from '../../../src/provider/index.ts';
import { withSpan } from '../../../src/tracing/index.ts';
import { callContext } from '../../support/provider-calls.ts';
import { setupTestTracing, type TestTracing } from '../../support/tracing.ts';

const ctx = callContext;

/** get(id) answers by id: `ok…` succeeds, `slow` waits 30 ms, others throw the mapped error. */
function tinyProvider(): Provider & { closed: number; check(): Promise<TargetCheck[]> } {
  const errors: Record<string, () => unknown> = {
    gone: () => notFound('instance gone'),
    quota: () => quotaExceeded('quota CPUS exceeded'),
    perm: () => permanent('bad machine type'),
    flaky: () => transient('backend 503'),
    raw: () => new Error('socket hang up (password=hunter2)'),
  };
  return {
    name: 'tiny',
    type: 'local',
    closed: 0,
    async create(_ctx: CallContext, req: CreateRequest): Promise<Instance> {
      return { id: `local/${req.name}`, name: req.name, state: 'Pending' };
    },
    async get(_ctx: CallContext, id: string): Promise<Instance> {
      if (id === 'slow') await new Promise((r) => setTimeout(r, 30));
      const make = errors[id];
      if (make) throw make();
      return { id, name: id, state: 'Running', address: '127.0.0.1' };
    },
    async delete(): Promise<void> {},
    async listByTag(): Promise<Instance[]> {
      return [
        { id: 'local/a', name: 'a', state: 'Running' },
        { id: 'local/b', name: 'b', state: 'Running' },
      ];
    },
    async close() {
      this.closed++;
    },
    async check() {
      return [{ name: 'loopback', ready: true, reason: 'Reachable' }];
    },
  };
}

async function counterValue(reg: Registry, labels: Record<string, string>): Promise<number | undefined> {
  const metric = await reg.getSingleMetric('proxy_operator_provider_requests_total')!.get();
  return metric.values.find((v) => Object.entries(labels).every(([k, l]) => v.labels[k] === l))?.value;
}

describe('withMetrics', () => {
  it('counts every call by provider, op and result class', async () => {
    const reg = new Registry();
    const p = withMetrics(tinyProvider(), providerMetrics(reg));
    await p.get(ctx(), 'ok-1');
    await p.get(ctx(), 'ok-2');
    for (const id of ['gone', 'quota', 'perm', 'flaky', 'raw']) await p.get(ctx(), id).catch(() => {});
    await p.listByTag(ctx());

    const get = { provider: 'tiny', op: 'get' };
    expect(await counterValue(reg, { ...get, result: 'ok' })).toBe(2);
    expect(await counterValue(reg, { ...get, result: 'NotFound' })).toBe(1);
    expect(await counterValue(reg, { ...get, result: 'QuotaExceeded' })).toBe(1);
    expect(await counterValue(reg, { ...get, result: 'Permanent' })).toBe(1);
    // A typed transient and an unclassified error both count as Transient.
    expect(await counterValue(reg, { ...get, result: 'Transient' })).toBe(2);
    expect(await counterValue(reg, { provider: 'tiny', op: 'listByTag', result: 'ok' })).toBe(1);
  });

  it('observes the duration of every call, failed ones included', async () => {
    const reg = new Registry();
    const p = withMetrics(tinyProvider(), providerMetrics(reg));
    await p.get(ctx(), 'slow');
    await p.get(ctx(), 'gone').catch(() => {});
    const hist = await (
      reg.getSingleMetric('proxy_operator_provider_request_duration_seconds') as Histogram
    ).get();
    const count = hist.values.find((v) => v.metricName?.endsWith('_count') && v.labels.op === 'get');
    const sum = hist.values.find((v) => v.metricName?.endsWith('_sum') && v.labels.op === 'get');
    expect(count?.value).toBe(2);
    expect(sum?.value).toBeGreaterThanOrEqual(0.025);
  });

  it('rethrows the very error the provider threw', async () => {
    const p = withMetrics(tinyProvider(), providerMetrics(new Registry()));
    const raw = tinyProvider();
    const original = await raw.get(ctx(), 'quota').catch((e: unknown) => e);
    const seen = await p.get(ctx(), 'quota').catch((e: unknown) => e);
    expect(seen).toBeInstanceOf(Error);
    expect((seen as Error).message).toBe((original as Error).message);
    // Same instance: a provider that throws one shared object sees it come back unchanged.
    const shared = permanent('shared');
    const thrower = withMetrics(
      { ...raw, get: () => Promise.reject(shared) },
      providerMetrics(new Registry()),
    );
    await expect(thrower.get(ctx(), 'x')).rejects.toBe(shared);
  });

  it('shares the metrics when asked twice on one registry', () => {
    const reg = new Registry();
    expect(providerMetrics(reg).requests).toBe(providerMetrics(reg).requests);
  });
});

describe('withTracing', () => {
  let tracing: TestTracing;
  beforeEach(() => {
    tracing = setupTestTracing();
  });
  afterEach(async () => {
    await tracing.shutdown();
  });

  it('makes one provider.<op> span per call, child of the caller span, with ids only', async () => {
    const p = withTracing(tinyProvider(), tracing.tracer);
    const req: CreateRequest = {
      name: 'px-abc-123',
      uid: 'u1',
      namespace: 'crawl',
      proxyName: 'eu-1',
      port: 3128,
      cloudInit: '#cloud-config\nsecret-marker-cloudinit',
      credentials: { username: 'user-marker', password: 'pw-marker' },
    };
    await withSpan(tracing.tracer, 'reconcile', {}, async () => {
      await p.create(ctx(), req);
      await p.get(ctx(), 'local/px-abc-123');
      await p.listByTag(ctx());
    });
    const parent = tracing.span('reconcile');
    const create = tracing.span('provider.create');
    const get = tracing.span('provider.get');
    for (const s of [create, get, tracing.span('provider.listByTag')]) {
      expect(s.parentSpanContext?.spanId).toBe(parent.spanContext().spanId);
      expect(s.spanContext().traceId).toBe(parent.spanContext().traceId);
      expect(s.attributes['provider.name']).toBe('tiny');
      expect(s.attributes['provider.type']).toBe('local');
    }
    expect(create.attributes['provider.instance_name']).toBe('px-abc-123');
    expect(create.attributes['provider.id']).toBe('local/px-abc-123');
    expect(get.attributes['provider.id']).toBe('local/px-abc-123');
    expect(tracing.span('provider.listByTag').attributes['provider.instances']).toBe(2);
    const everything = JSON.stringify(tracing.spans().map((s) => ({ a: s.attributes, e: s.events })));
    for (const secret of ['secret-marker-cloudinit', 'user-marker', 'pw-marker']) {
      expect(everything).not.toContain(secret);
    }
  });

  it('marks failures with the error class and keeps foreign messages out', async () => {
    const p = withTracing(tinyProvider(), tracing.tracer);
    const err = await p.get(ctx(), 'quota').catch((e: unknown) => e);
    expect((err as Error).message).toBe('quota CPUS exceeded');
    await p.get(ctx(), 'raw').catch(() => {});
    const [quota, raw] = tracing.spans();
    expect(quota!.status).toEqual({ code: SpanStatusCode.ERROR, message: 'QuotaExceeded' });
    expect(quota!.attributes['provider.error_class']).toBe('QuotaExceeded');
    // Our own error: its message is safe and useful.
    expect(quota!.events[0]!.attributes?.['exception.message']).toBe('quota CPUS exceeded');
    expect(raw!.status.code).toBe(SpanStatusCode.ERROR);
    expect(raw!.attributes['provider.error_class']).toBe('Transient');
    expect(raw!.events[0]!.attributes?.['exception.type']).toBe('Error');
    expect(JSON.stringify(raw!.events)).not.toContain('hunter2');
  });

  it('rethrows the same error instance', async () => {
    const shared = notFound('gone for good');
    const base = tinyProvider();
    const p = withTracing(
      withMetrics({ ...base, get: () => Promise.reject(shared) }, providerMetrics(new Registry())),
      tracing.tracer,
    );
    await expect(p.get(ctx(), 'x')).rejects.toBe(shared);
  });
});

describe('decorated providers', () => {
  it('keep name, type and close but never expose check', async () => {
    const raw = tinyProvider();
    expect(isChecker(raw)).toBe(true);
    const tracing = setupTestTracing();
    try {
      const p = withTracing(withMetrics(raw, providerMetrics(new Registry())), tracing.tracer);
      expect(p.name).toBe('tiny');
      expect(p.type).toBe('local');
      expect(isChecker(p)).toBe(false);
      expect('check' in p).toBe(false);
      await p.close?.();
      expect(raw.closed).toBe(1);
    } finally {
      await tracing.shutdown();
    }
  });
});

describe('the provider registry', () => {
  it('hands out providers whose errors are attributed, without foreign messages on spans', async () => {
    const tracing = setupTestTracing();
    try {
      const registry = new Registry();
      const providers = providerRegistryFrom([tinyProvider()], { registry, tracer: tracing.tracer });
      const p = providers.get('tiny')!;
      const err = await p.get(ctx(), 'raw').catch((e: unknown) => e);
      expect(err).toBeInstanceOf(ProviderError);
      expect((err as ProviderError).provider).toBe('tiny');
      expect((err as ProviderError).op).toBe('get');
      // Tracing sits inside the attribution: it saw the raw error, so its text stayed out.
      const span = tracing.span('provider.get');
      expect(span.attributes['provider.error_class']).toBe('Transient');
      expect(JSON.stringify(span.events)).not.toContain('hunter2');
      expect(await counterValue(registry, { op: 'get', result: 'Transient' })).toBe(1);
      // GC and the reconciler get the same attributed provider.
      expect(providers.entries()[0]![1]).toBe(p);
    } finally {
      await tracing.shutdown();
    }
  });

  it('never wraps twice: withErrorOrigin of an attributed provider is that provider', async () => {
    const raw = tinyProvider();
    const once = withErrorOrigin(raw);
    expect(withErrorOrigin(once)).toBe(once);
    expect(withErrorOrigin(raw)).toBe(once);
    const providers = providerRegistryFrom([tinyProvider()], { registry: new Registry() });
    const p = providers.get('tiny')!;
    expect(withErrorOrigin(p)).toBe(p);
  });
});
