/**
 * The lease feed during a replacement (docs/lease-api.md, "Draining instances"): grants carry the
 * credentials the serving instance really has (its credentials generation), not what a rotated
 * Secret says; leases remember the instance they were granted on, so the reconciler can wait
 * for them; the replaced instance shows as draining with its live leases.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { LABEL_CREDENTIALS_FOR } from '../../../src/api/constants.ts';
import { startLeaseFeed } from '../../../src/lease/feed.ts';
import { LeaseStore } from '../../../src/lease/store.ts';
import { createMemoryStore, type MemoryStore } from '../../../src/runtime/memory.ts';
import { FakeClock } from '../../support/clock.ts';

const NS = 'crawl';
const NOW = '2026-01-01T00:00:00Z';
const cleanups: (() => void)[] = [];
afterEach(() => {
  for (const c of cleanups.splice(0)) c();
});

function generation(store: MemoryStore, uid: string, g: number, password: string): void {
  store.seedSecret({
    metadata: {
      name: `eu-1-served-credentials-${g}`,
      namespace: NS,
      labels: { [LABEL_CREDENTIALS_FOR]: 'eu-1' },
      ownerReferences: [{ apiVersion: 'crawl.example.com/v1alpha1', kind: 'Proxy', name: 'eu-1', uid }],
    },
    stringData: { username: 'crawler', password },
  });
}

describe('lease feed during a replacement', () => {
  it('grants with the serving generation, counts leases per instance, shows the drain', async () => {
    const clock = new FakeClock();
    const store = createMemoryStore({ clock });
    const leases = new LeaseStore({ clock });
    const ac = new AbortController();
    const feed = startLeaseFeed({ store, leases, signal: ac.signal, clock });
    cleanups.push(() => {
      ac.abort();
      leases.close();
    });
    // The credentials Secret is already rotated; the serving instance still has generation 1.
    store.seedSecret({
      metadata: { name: 'eu-1-auth', namespace: NS },
      stringData: { username: 'crawler', password: 'rotated' },
    });
    const p = store.seedProxy({
      metadata: { name: 'eu-1', namespace: NS },
      spec: { type: 'Managed', provider: 'local' },
      status: {
        phase: 'Replacing',
        providerID: 'local/old',
        address: '127.0.0.1',
        port: 4000,
        credentialsGeneration: 1,
        pending: {
          providerID: 'local/new',
          instanceName: 'new',
          address: '127.0.0.1',
          port: 4001,
          credentialsGeneration: 2,
        },
        conditions: [{ type: 'Healthy', status: 'True', reason: 'ProbeSucceeded', lastTransitionTime: NOW }],
      },
    });
    const uid = p.metadata.uid ?? '';
    generation(store, uid, 1, 'old-password');
    await feed.idle();
    let out = leases.lease({});
    if (!out.granted) throw new Error('refused');
    expect(out.grant.proxy.url).toBe('http://crawler:old-password@127.0.0.1:4000');
    expect(leases.leasesOn(`${NS}/eu-1`, 'local/old')).toBe(1);
    const held = out.grant.id;

    generation(store, uid, 2, 'new-password');
    await store.proxies.patchStatus(
      { namespace: NS, name: 'eu-1' },
      {
        phase: 'Ready',
        providerID: 'local/new',
        port: 4001,
        credentialsGeneration: 2,
        pending: null,
        draining: [
          { providerID: 'local/old', address: '127.0.0.1', port: 4000, credentialsGeneration: 1, since: NOW },
        ],
      },
    );
    await feed.idle();
    out = leases.lease({});
    if (!out.granted) throw new Error('refused');
    expect(out.grant.proxy.url).toBe('http://crawler:new-password@127.0.0.1:4001');
    expect(leases.leasesOn(`${NS}/eu-1`, 'local/new')).toBe(1);
    expect(leases.snapshot()[0]!.drainingInstances).toEqual([
      { host: '127.0.0.1', port: 4000, since: NOW, activeLeases: 1 },
    ]);
    leases.release(held);
    expect(leases.leasesOn(`${NS}/eu-1`, 'local/old')).toBe(0);
    expect(leases.snapshot()[0]!.drainingInstances![0]!.activeLeases).toBe(0);
  });
});
