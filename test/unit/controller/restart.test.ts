/**
 * The Proxy controller's in-place restart (controller/restart), asked for by the
 * restart-requested annotation the pool sets under rotation `strategy: Restart`: with the gcp
 * provider through the official client against the fake GCE on loopback. It drains first (a
 * live lease holds it, up to the drain timeout on the injected clock), serves nothing while
 * the VM stops and starts, comes back Ready at a new address with status.restart Done; a
 * restart under way survives an operator restart without being taken for a lost instance; a
 * provider that cannot restart, or a restart failing for good, is recorded as Failed and the
 * usual rows take over.
 */
import { googleAuthLibrary } from 'google-gax';
import { describe, expect, it } from 'vitest';
import { ANNOTATION_RESTART_REQUESTED } from '../../../src/api/constants.ts';
import { createProxyReconciler } from '../../../src/controller/reconciler.ts';
import type { Provider } from '../../../src/provider/contract.ts';
import { createGcpProvider, type GcpProvider } from '../../../src/provider/gcp/index.ts';
import { FakeClock } from '../../support/clock.ts';
import {
  condition,
  createHarness,
  type Harness,
  NS,
  TEST_INSTALLATION,
  testOptions,
} from '../../support/controller/harness.ts';
import { natIPOf } from '../../support/fake-gce-power.ts';
import { useFakeGce } from '../../support/gce-suite.ts';
import { until } from '../../support/wait.ts';

const PROJECT = 'proj-restart-ctl';
const ZONE = 'europe-west1-b';

const gce = useFakeGce({ zones: [ZONE], boot: true });
const { providers } = gce;

function gcp(operationWaitMs = 5000): GcpProvider {
  const p = createGcpProvider({
    name: 'gce',
    config: { project: PROJECT },
    clientOptions: {
      apiEndpoint: '127.0.0.1',
      port: gce.fake.port,
      protocol: 'http',
      authClient: new googleAuthLibrary.PassThroughClient(),
    },
    callTimeoutMs: 5000,
    operationWaitMs,
  });
  providers.push(p);
  return p;
}

const posts = (suffix: string) =>
  gce.fake.requests.filter((r) => r.method === 'POST' && r.path.endsWith(suffix)).length;
const deletes = () => gce.fake.requests.filter((r) => r.method === 'DELETE').length;

/** A Ready gcp Proxy `eu-1` on a harness with an injected clock and a lease count to set. */
async function readyProxy(
  provider: Provider,
  clock: FakeClock,
  leases: { n: number },
): Promise<{ h: Harness; address: string }> {
  const h = await createHarness({
    deps: {
      providers: new Map([['gce', provider]]),
      clock,
      leasesOn: () => leases.n,
    },
    options: { drainTimeoutMs: 60_000, drainPollMs: 1_000 },
  });
  await h.seed('eu-1', { provider: 'gce', placement: { zone: ZONE } });
  for (let i = 0; i < 5 && h.proxy('eu-1')?.status?.phase !== 'Ready'; i++) await h.reconcile('eu-1');
  expect(h.proxy('eu-1')?.status?.phase).toBe('Ready');
  return { h, address: h.proxy('eu-1')?.status?.address ?? '' };
}

/** What the pool does: no new leases, and the request's time. */
async function requestRestart(h: Harness, at: string): Promise<void> {
  const p = await h.store.proxies.read({ namespace: NS, name: 'eu-1' });
  p.spec.drain = true;
  p.metadata.annotations = { ...(p.metadata.annotations ?? {}), [ANNOTATION_RESTART_REQUESTED]: at };
  await h.store.proxies.update(p);
}

describe('in-place restart (controller/restart)', () => {
  it('drains until the live lease ends, then stops and starts the VM: Ready at a new address', async () => {
    const clock = new FakeClock();
    const leases = { n: 1 };
    const { h, address } = await readyProxy(gcp(), clock, leases);
    await requestRestart(h, new Date(clock.now()).toISOString());
    // First pass: Draining, and at least one drain poll before anything stops.
    expect((await h.reconcile('eu-1')).requeueAfter).toBe(1_000);
    expect(h.proxy('eu-1')?.status?.restart).toMatchObject({ phase: 'Draining' });
    clock.advance(1_000);
    expect((await h.reconcile('eu-1')).requeueAfter).toBe(1_000);
    expect(h.proxy('eu-1')?.status).toMatchObject({
      phase: 'Ready',
      address,
      restart: { phase: 'Draining' },
    });
    expect(posts('/stop')).toBe(0);
    leases.n = 0;
    await h.reconcile('eu-1');
    const s = h.proxy('eu-1')?.status;
    expect(s?.phase).toBe('Ready');
    expect(s?.address).not.toBe(address);
    expect(s?.address).toBe(natIPOf(gce.fake.instances.get(`${PROJECT}/${ZONE}/${s?.instanceName}`) ?? {}));
    expect(s?.restart).toMatchObject({ phase: 'Done', previousAddress: address });
    expect(s?.restart?.finishedAt).toBeDefined();
    expect(condition(h.proxy('eu-1'), 'Provisioned')).toMatchObject({
      status: 'True',
      reason: 'InstanceRunning',
    });
    expect([posts('/stop'), posts('/start'), posts('/instances'), deletes()]).toEqual([1, 1, 1, 0]);
    // Answered: further passes change nothing.
    await h.reconcile('eu-1');
    expect([posts('/stop'), posts('/start')]).toEqual([1, 1]);
  });

  it('restarts under a live lease once the drain timeout has passed', async () => {
    const clock = new FakeClock();
    const { h, address } = await readyProxy(gcp(), clock, { n: 2 });
    await requestRestart(h, new Date(clock.now()).toISOString());
    await h.reconcile('eu-1');
    clock.advance(60_000);
    await h.reconcile('eu-1');
    expect(h.proxy('eu-1')?.status).toMatchObject({ phase: 'Ready', restart: { phase: 'Done' } });
    expect(h.proxy('eu-1')?.status?.address).not.toBe(address);
  });

  it('a restart under way survives an operator restart and is never taken for a lost instance', async () => {
    const clock = new FakeClock();
    const { h } = await readyProxy(gcp(30), clock, { n: 0 });
    gce.fake.operationDelayMs = 400;
    await requestRestart(h, new Date(clock.now()).toISOString());
    await h.reconcile('eu-1');
    clock.advance(1_000);
    await h.reconcile('eu-1');
    expect(h.proxy('eu-1')?.status).toMatchObject({ phase: 'Restarting', restart: { phase: 'Restarting' } });
    expect(h.proxy('eu-1')?.status?.address).toBeUndefined();
    expect(condition(h.proxy('eu-1'), 'Provisioned')).toMatchObject({
      status: 'False',
      reason: 'Restarting',
    });
    // A new operator process: another provider (no memory of the operations), another reconciler.
    const rec = createProxyReconciler({
      store: h.store,
      providers: new Map([['gce', gcp(30)]]),
      options: testOptions,
      installation: TEST_INSTALLATION,
      clock,
    });
    await until(
      'the restart to finish',
      async () => {
        await rec.reconcile(`${NS}/eu-1`, new AbortController().signal);
        return h.proxy('eu-1')?.status?.phase === 'Ready';
      },
      { timeoutMs: 10_000, intervalMs: 50 },
    );
    expect(h.proxy('eu-1')?.status?.restart?.phase).toBe('Done');
    // Stopped and started once each; never deleted, never inserted again.
    expect([posts('/stop'), posts('/start'), posts('/instances'), deletes()]).toEqual([1, 1, 1, 0]);
  });

  it('a provider that cannot restart: status.restart Failed naming it, the proxy keeps serving', async () => {
    const h = await createHarness();
    await h.seed('eu-1');
    await h.reconcile('eu-1');
    const before = h.proxy('eu-1')?.status;
    expect(before?.phase).toBe('Ready');
    await requestRestart(h, '2026-01-01T00:00:00Z');
    await h.reconcile('eu-1');
    const s = h.proxy('eu-1')?.status;
    expect(s?.restart).toMatchObject({
      phase: 'Failed',
      requestedAt: '2026-01-01T00:00:00Z',
      message: 'provider "fake" (type fake) cannot restart an instance for a new IP',
    });
    expect(s).toMatchObject({ phase: 'Ready', address: before?.address, providerID: before?.providerID });
  });

  it('a start failing for good: Failed, and the stopped VM is then a lost instance, re-created', async () => {
    const clock = new FakeClock();
    const { h } = await readyProxy(gcp(), clock, { n: 0 });
    gce.fake.failOperation({ type: 'start', code: 'PERMISSIONS_ERROR', message: 'no permission to start' });
    await requestRestart(h, new Date(clock.now()).toISOString());
    await h.reconcile('eu-1');
    clock.advance(1_000);
    await h.reconcile('eu-1');
    expect(h.proxy('eu-1')?.status?.restart).toMatchObject({
      phase: 'Failed',
      message: expect.stringContaining('PERMISSIONS_ERROR: no permission to start'),
    });
    // The usual rows: a TERMINATED VM is deleted and created again under the same name.
    for (let i = 0; i < 6 && h.proxy('eu-1')?.status?.phase !== 'Ready'; i++) await h.attempt('eu-1');
    expect(h.proxy('eu-1')?.status?.phase).toBe('Ready');
    expect(deletes()).toBe(1);
    expect(posts('/instances')).toBe(2);
  });
});
