/**
 * The health engine's side of a replacement (docs/health.md, "Replacements"), with an injected
 * probe, a FakeClock and the memory store: status.pending is probed with the credentials its
 * generation holds, from Unknown, and only after successThreshold passes does
 * status.replacementHealth say healthy (failures after failureThreshold say why); those
 * verdicts never reach the lease store. At the switch the passed verdict carries over to the
 * serving instance without a gap; an instance that changes any other way (a lost one
 * re-created) is unleasable until probed again, and a proxy that stops serving or serves such an
 * instance has Healthy=Unknown (NotServing) in status meanwhile.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { LABEL_CREDENTIALS_FOR } from '../../../src/api/constants.ts';
import type { ProxyObject } from '../../../src/api/proxy.ts';
import { HealthEngine, type HealthVerdict } from '../../../src/health/engine.ts';
import type { ProbeResult, ProbeTarget } from '../../../src/health/probe.ts';
import { createMemoryStore, type MemoryStore } from '../../../src/runtime/memory.ts';
import { ObjectEngine } from '../../../src/runtime/objects/engine.ts';
import { FakeClock } from '../../support/clock.ts';

const NS = 'crawl';
const OK: ProbeResult = { ok: true, latencyMs: 10, status: 204 };
const AUTH: ProbeResult = {
  ok: false,
  reason: 'ProxyAuthRequired',
  message: 'proxy answered 407',
  latencyMs: 3,
};

let engines: HealthEngine[] = [];
afterEach(async () => {
  await Promise.all(engines.map((e) => e.stop()));
  engines = [];
});

interface Rig {
  store: MemoryStore;
  verdicts: HealthVerdict[];
  calls: ProbeTarget[];
  results: Map<number, ProbeResult>;
  engine: HealthEngine;
  advance(ms: number): Promise<void>;
  status(): NonNullable<ProxyObject['status']>;
}

function rig(successThreshold = 3): Rig {
  const clock = new FakeClock();
  // Seeded uids: a proxy's probe slot is a hash of its uid, and a random one put the slot on the
  // very millisecond of the patch now and then (offset 0: a second pass inside the window
  // counted as one; reproduced with uid …000000000644).
  let uids = 0;
  const store = createMemoryStore({
    clock,
    engine: new ObjectEngine({
      clock,
      uid: () => `00000000-0000-4000-8000-${String(++uids).padStart(12, '0')}`,
    }),
  });
  const verdicts: HealthVerdict[] = [];
  const calls: ProbeTarget[] = [];
  const results = new Map<number, ProbeResult>();
  const engine = new HealthEngine({
    store,
    clock,
    controlProbe: false,
    defaults: { successThreshold, failureThreshold: 2 },
    probe: async (target) => {
      calls.push(target);
      return results.get(target.port) ?? OK;
    },
    listener: (v) => verdicts.push(v),
  });
  engines.push(engine);
  return {
    store,
    verdicts,
    calls,
    results,
    engine,
    async advance(ms) {
      for (let done = 0; done < ms; done += 100) {
        clock.advance(100);
        for (let i = 0; i < 5; i++) await new Promise<void>((r) => setImmediate(r));
      }
    },
    status: () => store.proxies.get({ namespace: NS, name: 'eu-1' })!.status!,
  };
}

function generationSecret(store: MemoryStore, uid: string, g: number, password: string): void {
  store.seedSecret({
    apiVersion: 'v1',
    kind: 'Secret',
    metadata: {
      name: `eu-1-served-credentials-${g}`,
      namespace: NS,
      labels: { [LABEL_CREDENTIALS_FOR]: 'eu-1' },
      ownerReferences: [{ apiVersion: 'crawl.example.com/v1alpha1', kind: 'Proxy', name: 'eu-1', uid }],
    },
    stringData: { username: 'crawler', password },
  });
}

function seedServing(store: MemoryStore): void {
  const p = store.seedProxy({
    apiVersion: 'crawl.example.com/v1alpha1',
    kind: 'Proxy',
    metadata: { name: 'eu-1', namespace: NS },
    spec: { provider: 'fake' },
    status: {
      phase: 'Ready',
      providerID: 'fake/old',
      address: '127.0.0.1',
      port: 5001,
      credentialsGeneration: 1,
    },
  });
  const uid = p.metadata.uid ?? '';
  generationSecret(store, uid, 1, 'old-password');
  generationSecret(store, uid, 2, 'new-password');
}

async function patch(store: MemoryStore, status: Record<string, unknown>): Promise<void> {
  await store.proxies.patchStatus({ namespace: NS, name: 'eu-1' }, status);
}

describe('replacement probing', () => {
  it('probes the pending instance with its own generation, gated by successThreshold', async () => {
    const r = rig(3);
    seedServing(r.store);
    r.engine.start();
    await r.advance(1000);
    expect(r.verdicts).toEqual([expect.objectContaining({ key: `${NS}/eu-1`, healthy: true })]);
    const serving = r.calls.filter((c) => c.port === 5001);
    expect(serving[0]!.credentials?.password).toBe('old-password');

    r.results.set(5002, AUTH);
    await patch(r.store, {
      phase: 'Replacing',
      pending: {
        providerID: 'fake/new',
        instanceName: 'new',
        address: '127.0.0.1',
        port: 5002,
        credentialsGeneration: 2,
      },
    });
    await r.advance(1000);
    const pendingCalls = r.calls.filter((c) => c.port === 5002);
    expect(pendingCalls.length).toBeGreaterThanOrEqual(1);
    expect(pendingCalls[0]!.credentials?.password).toBe('new-password');
    // The old instance goes on being probed with what it has.
    expect(r.calls.filter((c) => c.port === 5001).at(-1)!.credentials?.password).toBe('old-password');
    await r.advance(1000);
    expect(r.status().replacementHealth).toMatchObject({
      providerID: 'fake/new',
      healthy: false,
      lastError: 'ProxyAuthRequired: proxy answered 407',
    });

    r.results.delete(5002);
    await r.advance(1000); // one pass of three
    expect(r.status().replacementHealth?.healthy).toBe(false);
    await r.advance(2000);
    expect(r.status().replacementHealth).toMatchObject({ providerID: 'fake/new', healthy: true });
    expect(r.status().replacementHealth?.lastError).toBeUndefined();
    // Only the serving instance's verdicts reach the lease store.
    expect(r.verdicts).toHaveLength(1);

    // The switch: the passed verdict carries over at once, no gap in leasability.
    await patch(r.store, {
      phase: 'Ready',
      providerID: 'fake/new',
      port: 5002,
      credentialsGeneration: 2,
      pending: null,
      draining: [
        { providerID: 'fake/old', address: '127.0.0.1', port: 5001, since: new Date().toISOString() },
      ],
    });
    expect(r.verdicts).toHaveLength(2);
    expect(r.verdicts.at(-1)).toMatchObject({ healthy: true });
    const n = r.calls.length;
    await r.advance(1000);
    expect(r.calls.slice(n).every((c) => c.port === 5002 && c.credentials?.password === 'new-password')).toBe(
      true,
    );
  });

  it('a serving instance that changed without passing (a lost one re-created) is unleasable until probed', async () => {
    const r = rig(2);
    seedServing(r.store);
    r.engine.start();
    await r.advance(1000);
    expect(r.verdicts.at(-1)).toMatchObject({ healthy: true });
    // Re-created elsewhere, straight to Ready (no pending): the old verdict must not carry over.
    await patch(r.store, { providerID: 'fake/recreated', port: 5003 });
    expect(r.verdicts.at(-1)).toMatchObject({ healthy: false });
    // Status takes the old verdict back too: Unknown until the new instance is judged.
    const healthy = () => r.status().conditions?.find((c) => c.type === 'Healthy');
    await r.advance(100);
    expect(healthy()).toMatchObject({ status: 'Unknown', reason: 'NotServing' });
    await r.advance(900); // one pass of two
    expect(r.verdicts.at(-1)).toMatchObject({ healthy: false });
    expect(healthy()).toMatchObject({ status: 'Unknown', reason: 'NotServing' });
    await r.advance(1000);
    expect(r.verdicts.at(-1)).toMatchObject({ healthy: true });
    expect(healthy()).toMatchObject({ status: 'True', reason: 'ProbeSucceeded' });
  });

  it('an instance that stops serving (address cleared) loses its verdict at once', async () => {
    const r = rig(1);
    seedServing(r.store);
    r.engine.start();
    await r.advance(1000);
    expect(r.status().conditions?.find((c) => c.type === 'Healthy')).toMatchObject({ status: 'True' });
    await patch(r.store, { phase: 'Restarting', address: null, port: null });
    expect(r.verdicts.at(-1)).toMatchObject({ healthy: false });
    // Status too: the verdict was about an instance that no longer serves there.
    await r.advance(100);
    expect(r.status().conditions?.find((c) => c.type === 'Healthy')).toMatchObject({
      status: 'Unknown',
      reason: 'NotServing',
    });
    expect(r.status().health).toEqual({ consecutiveFailures: 0, lastProbeTime: expect.any(String) });
  });
});
