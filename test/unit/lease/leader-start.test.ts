/**
 * A new leader starts from the verdicts in status: its lease store is fresh, no probe has run
 * yet, and the Proxies' Healthy conditions (written by the health engine of an earlier leader)
 * decide what is leasable until its own health engine has a verdict (src/lease/feed.ts). Both
 * an in-process store seeded before the feed starts and an embedded store reopened from the
 * state file an earlier process wrote.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { API_VERSION, CONDITION_HEALTHY, PROXY_KIND } from '../../../src/api/constants.ts';
import type { ProxyObject } from '../../../src/api/proxy.ts';
import { startLeaseFeed } from '../../../src/lease/feed.ts';
import { LeaseStore } from '../../../src/lease/store.ts';
import { createEmbeddedStore } from '../../../src/runtime/embedded/store.ts';
import { createMemoryStore } from '../../../src/runtime/memory.ts';
import type { ObjectStore } from '../../../src/runtime/store.ts';

const NS = 'crawl';
const AT = '2026-01-01T00:00:00Z';

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

/** name → the Healthy condition status an earlier leader left in status (undefined: none). */
const VERDICTS = {
  'was-healthy-1': 'True',
  'was-healthy-2': 'True',
  'was-unhealthy': 'False',
  'not-judged': 'Unknown',
} as const;

function status(verdict: 'True' | 'False' | 'Unknown', port: number): NonNullable<ProxyObject['status']> {
  return {
    phase: 'Ready',
    address: '127.0.0.1',
    port,
    conditions: [
      {
        type: CONDITION_HEALTHY,
        status: verdict,
        reason: verdict === 'True' ? 'ProbeSucceeded' : verdict === 'False' ? 'ProbeFailed' : 'Pending',
        lastTransitionTime: AT,
      },
    ],
  };
}

async function writeProxies(store: ObjectStore): Promise<void> {
  let port = 4000;
  for (const [name, verdict] of Object.entries(VERDICTS)) {
    await store.proxies.create({
      apiVersion: API_VERSION,
      kind: PROXY_KIND,
      metadata: { name, namespace: NS },
      spec: { type: 'External', endpoint: { host: '127.0.0.1', port: ++port } },
    });
    await store.proxies.patchStatus({ namespace: NS, name }, status(verdict, port));
  }
}

/** A fresh lease store and feed on `store`, as a new leader builds them; no health engine. */
async function newLeader(store: ObjectStore): Promise<LeaseStore> {
  const leases = new LeaseStore();
  const ac = new AbortController();
  const feed = startLeaseFeed({ store, leases, signal: ac.signal });
  cleanups.push(() => {
    ac.abort();
    leases.close();
  });
  await feed.idle();
  return leases;
}

function expectVerdictsFollowed(leases: LeaseStore): void {
  const byName = new Map(leases.snapshot().map((s) => [s.name, s]));
  expect([...byName.keys()].sort()).toEqual(Object.keys(VERDICTS).sort());
  expect(byName.get('was-healthy-1')).toMatchObject({ healthy: true, leasable: true, reason: null });
  expect(byName.get('was-healthy-2')).toMatchObject({ healthy: true, leasable: true, reason: null });
  expect(byName.get('was-unhealthy')).toMatchObject({ healthy: false, leasable: false, reason: 'Unhealthy' });
  expect(byName.get('not-judged')).toMatchObject({ healthy: false, leasable: false, reason: 'Unhealthy' });
  // Grants go to the proxies status calls healthy, and only to them.
  const granted = new Set<string>();
  for (let i = 0; i < 20; i++) {
    const out = leases.lease({});
    if (!out.granted) throw new Error(`lease ${i} refused: ${JSON.stringify(out.counts)}`);
    granted.add(out.grant.proxy.name);
  }
  expect([...granted].sort()).toEqual(['was-healthy-1', 'was-healthy-2']);
}

describe('a new leader starts from the health verdicts in status', () => {
  it('in-process store: Healthy=True is leasable before any probe, Healthy=False and Unknown are not', async () => {
    const store = createMemoryStore();
    await writeProxies(store);
    expectVerdictsFollowed(await newLeader(store));
  });

  it('embedded store reopened from the state file an earlier process wrote', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'leader-start-'));
    cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
    const statePath = join(dir, 'state.json');
    const before = await createEmbeddedStore({ statePath, rescanIntervalMs: 0 });
    await writeProxies(before);
    await before.stop();

    const after = await createEmbeddedStore({ statePath, rescanIntervalMs: 0 });
    cleanups.push(() => after.stop());
    expectVerdictsFollowed(await newLeader(after));
  });
});
