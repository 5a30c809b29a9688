/**
 * `spec.credentialsRotation`: the generated `<proxy>-auth` credentials of a Managed proxy are
 * replaced once the interval has passed since the last rotation (never before), through the
 * health-gated replacement — the old instance keeps serving until the new one passed its
 * probes — and the reconciler asks to come back in time for the next rotation.
 */
import { describe, expect, it } from 'vitest';
import { credentialsFromSecret } from '../../../src/api/credentials.ts';
import { FakeClock } from '../../support/clock.ts';
import { createHarness, type Harness, NS } from '../../support/controller/harness.ts';

const DAY_MS = 86_400_000;

async function world() {
  const clock = new FakeClock();
  const h = await createHarness({
    options: { healthGate: true, drainTimeoutMs: 600_000, drainPollMs: 5_000 },
    deps: { clock, leasesOn: () => 0 },
  });
  return { h, clock };
}

const auth = (h: Harness, name: string) => h.store.secrets.get({ namespace: NS, name: `${name}-auth` });
const password = (h: Harness, name: string) => credentialsFromSecret(auth(h, name)!)?.password;

/** The proxy stays leasable: it serves at an address, Ready or Replacing. */
function expectServing(h: Harness, name: string, address: string | undefined): void {
  const s = h.proxy(name)!.status!;
  expect(['Ready', 'Replacing']).toContain(s.phase);
  expect(s.address).toBe(address);
}

describe('spec.credentialsRotation', () => {
  it('rotates after the interval, not before, through the health gate, and schedules the next one', async () => {
    const { h, clock } = await world();
    await h.seed('eu-1', { credentialsRotation: { intervalSeconds: 86_400 } });
    await h.reconcile('eu-1');
    const first = h.proxy('eu-1')!.status!;
    expect(first.phase).toBe('Ready');
    const p1 = password(h, 'eu-1');
    expect(h.proxy('eu-1')!.status!.credentialsRotatedAt).toBe(new Date(clock.now()).toISOString());

    // Just before the interval: nothing changes, and the reconciler comes back in time.
    clock.advance(DAY_MS - 1000);
    const early = await h.reconcile('eu-1');
    expect(password(h, 'eu-1')).toBe(p1);
    expect(h.proxy('eu-1')!.status!.instanceName).toBe(first.instanceName);
    expect(early.requeueAfter).toBeGreaterThan(0);
    expect(early.requeueAfter).toBeLessThanOrEqual(1000);

    // Past it: new credentials, a replacement that waits for the health gate.
    clock.advance(2000);
    await h.reconcile('eu-1');
    const p2 = password(h, 'eu-1');
    expect(p2).not.toBe(p1);
    const replacing = h.proxy('eu-1')!.status!;
    expect(replacing.pending?.providerID).toBeDefined();
    expect(replacing.pending?.credentialsGeneration).toBe(2);
    expectServing(h, 'eu-1', first.address);
    await h.reconcile('eu-1');
    expectServing(h, 'eu-1', first.address);
    expect(h.proxy('eu-1')!.status!.providerID).toBe(first.providerID);
    expect(h.fake.instances.has(first.providerID!)).toBe(true);

    // The health engine passes the replacement: switch; the old instance drains.
    await h.store.proxies.patchStatus(
      { namespace: NS, name: 'eu-1' },
      { replacementHealth: { providerID: replacing.pending!.providerID, healthy: true } },
    );
    const switched = await h.reconcile('eu-1');
    const after = h.proxy('eu-1')!.status!;
    expect(after.providerID).toBe(replacing.pending!.providerID);
    expect(after.credentialsGeneration).toBe(2);
    expect(after.phase).toBe('Ready');
    expect(h.fake.instances.get(after.providerID!)?.request.credentials.password).toBe(p2);
    expect(switched.requeueAfter).toBeGreaterThan(0);
    expect(h.proxy('eu-1')!.status!.credentialsRotatedAt).toBe(new Date(clock.now()).toISOString());
    // Only one rotation per interval: reconciling again changes nothing.
    await h.reconcile('eu-1');
    expect(password(h, 'eu-1')).toBe(p2);
    const next = await h.reconcile('eu-1');
    expect(next.requeueAfter).toBeLessThanOrEqual(DAY_MS);
    expect(next.requeueAfter).toBeGreaterThan(DAY_MS - 10_000);
  });

  it('a proxy without credentialsRotation keeps its credentials for good', async () => {
    const { h, clock } = await world();
    await h.seed('eu-2');
    await h.reconcile('eu-2');
    const p1 = password(h, 'eu-2');
    clock.advance(400 * DAY_MS);
    await h.reconcile('eu-2');
    expect(password(h, 'eu-2')).toBe(p1);
    expect(h.proxy('eu-2')!.status!.credentialsRotatedAt).toBeUndefined();
  });

  it('turning rotation on for existing credentials starts the interval then', async () => {
    const { h, clock } = await world();
    await h.seed('eu-3');
    await h.reconcile('eu-3');
    const p1 = password(h, 'eu-3');
    clock.advance(10 * DAY_MS);
    const p = h.proxy('eu-3')!;
    await h.store.proxies.update({
      ...p,
      spec: { ...p.spec, credentialsRotation: { intervalSeconds: 86_400 } },
    });
    await h.reconcile('eu-3');
    expect(password(h, 'eu-3')).toBe(p1);
    clock.advance(DAY_MS + 1000);
    await h.reconcile('eu-3');
    expect(password(h, 'eu-3')).not.toBe(p1);
  });
});
