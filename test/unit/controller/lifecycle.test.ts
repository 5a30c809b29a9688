/**
 * The safe instance lifecycle as the reconciler drives it (docs/architecture.md, "The Proxy
 * state machine"): a replacement is recorded as `status.pending` and switched to only once the
 * health engine passed it (`status.replacementHealth`, written here the way the engine writes
 * it); the old instance drains — no new leases, deleted once its leases end or at the drain
 * timeout; replacements per provider stay within the surge limit; a permanent error on a spec
 * edit keeps the old instance serving; deleting mid-replacement deletes both instances.
 */
import { describe, expect, it } from 'vitest';
import type { ProxyObject } from '../../../src/api/proxy.ts';
import { servedCredentials } from '../../../src/api/served-credentials.ts';
import { FakeClock } from '../../support/clock.ts';
import { condition, createHarness, type Harness, NS, untilQuiet } from '../../support/controller/harness.ts';

interface World {
  h: Harness;
  clock: FakeClock;
  /** Live leases per `key|providerID`, as the lease store would count them. */
  leases: Map<string, number>;
}

async function world(opts: { surge?: number; drainTimeoutMs?: number } = {}): Promise<World> {
  const clock = new FakeClock();
  const leases = new Map<string, number>();
  const h = await createHarness({
    options: { healthGate: true, drainTimeoutMs: opts.drainTimeoutMs ?? 600_000, drainPollMs: 5_000 },
    deps: {
      clock,
      leasesOn: (key: string, id: string) => leases.get(`${key}|${id}`) ?? 0,
      ...(opts.surge ? { maxConcurrentReplacements: { count: opts.surge } } : {}),
    },
  });
  return { h, clock, leases };
}

/** What the health engine writes once the pending instance passed successThreshold probes. */
async function passHealth(h: Harness, name: string, healthy = true, lastError?: string): Promise<void> {
  const p = h.proxy(name)!;
  const providerID = p.status!.pending!.providerID;
  await h.store.proxies.patchStatus(
    { namespace: NS, name },
    { replacementHealth: { providerID, healthy, ...(lastError ? { lastError } : {}) } },
  );
}

async function editSpec(h: Harness, name: string, zone: string): Promise<void> {
  const p = h.proxy(name)!;
  await h.store.proxies.update({ ...p, spec: { ...p.spec, placement: { ...p.spec.placement, zone } } });
}

const ids = (h: Harness) => [...h.fake.instances.keys()].sort();

describe('health-gated switch', () => {
  it('keeps the old instance serving until the health engine passed the new one', async () => {
    const { h } = await world();
    await h.seed('eu-1');
    await h.reconcile('eu-1');
    const old = h.proxy('eu-1')!.status!;
    expect(old.credentialsGeneration).toBe(1);
    await editSpec(h, 'eu-1', 'z2');

    // Running with an address, but not passed yet: still Replacing on the old address.
    await h.reconcile('eu-1');
    let p = h.proxy('eu-1')!;
    const fresh = ids(h).find((id) => id !== old.providerID)!;
    expect(p.status).toMatchObject({
      phase: 'Replacing',
      providerID: old.providerID,
      address: old.address,
      pending: { providerID: fresh, address: h.fake.instances.get(fresh)!.address, credentialsGeneration: 1 },
    });
    expect(p.status!.message).toMatch(/waiting for .* to pass its health checks/);
    await h.reconcile('eu-1');
    expect(h.proxy('eu-1')!.status!.providerID).toBe(old.providerID);

    // A failed probe verdict is shown, and still no switch.
    await passHealth(h, 'eu-1', false, 'ProxyAuthRequired: 407');
    await h.reconcile('eu-1');
    p = h.proxy('eu-1')!;
    expect(p.status!.providerID).toBe(old.providerID);
    expect(p.status!.message).toContain('ProxyAuthRequired: 407');

    // Passed: one write switches, the old instance drains (no leases: deleted in the same pass).
    await passHealth(h, 'eu-1');
    await untilQuiet(h, 'eu-1');
    p = h.proxy('eu-1')!;
    expect(p.status).toMatchObject({ phase: 'Ready', providerID: fresh });
    expect(p.status!.pending).toBeUndefined();
    expect(p.status!.draining).toBeUndefined();
    expect(ids(h)).toEqual([fresh]);
    expect(condition(p, 'Provisioned')).toMatchObject({ status: 'True' });
  });

  it('a verdict about another instance does not switch', async () => {
    const { h } = await world();
    await h.seed('eu-1');
    await h.reconcile('eu-1');
    await h.store.proxies.patchStatus(
      { namespace: NS, name: 'eu-1' },
      { replacementHealth: { providerID: 'fake/someone-else', healthy: true } },
    );
    await editSpec(h, 'eu-1', 'z2');
    await h.reconcile('eu-1');
    await h.reconcile('eu-1');
    expect(h.proxy('eu-1')!.status!.phase).toBe('Replacing');
  });

  it('a credentials rotation records a new generation; the old one is kept while its instance drains', async () => {
    const { h, leases } = await world();
    await h.seed('eu-1');
    await h.reconcile('eu-1');
    const before = h.proxy('eu-1')!;
    const oldCreds = servedCredentials(h.store.secrets, before, 1)!;
    expect(oldCreds.username).toMatch(/^px-/);
    const auth = h.store.secrets.get({ namespace: NS, name: 'eu-1-auth' })!;
    await h.store.secrets.delete({ namespace: NS, name: 'eu-1-auth' });
    await h.seedSecret({
      metadata: { ...auth.metadata, resourceVersion: undefined },
      data: { username: auth.data!.username!, password: Buffer.from('rotated-password').toString('base64') },
    } as never);
    await h.reconcile('eu-1');
    let p = h.proxy('eu-1')!;
    expect(p.status!.credentialsGeneration).toBe(1);
    expect(p.status!.pending!.credentialsGeneration).toBe(2);
    expect(servedCredentials(h.store.secrets, p, 1)).toEqual(oldCreds);
    expect(servedCredentials(h.store.secrets, p, 2)!.password).toBe('rotated-password');

    leases.set(`${NS}/eu-1|${before.status!.providerID}`, 1);
    await passHealth(h, 'eu-1');
    await h.reconcile('eu-1');
    p = h.proxy('eu-1')!;
    expect(p.status!.credentialsGeneration).toBe(2);
    expect(p.status!.draining).toEqual([
      expect.objectContaining({ providerID: before.status!.providerID, credentialsGeneration: 1 }),
    ]);
    // Generation 1 stays readable while its instance drains; dropped once it is retired.
    expect(servedCredentials(h.store.secrets, p, 1)).toEqual(oldCreds);
    leases.clear();
    await untilQuiet(h, 'eu-1');
    p = h.proxy('eu-1')!;
    expect(p.status!.draining).toBeUndefined();
    expect(servedCredentials(h.store.secrets, p, 1)).toBeUndefined();
    expect(h.store.secrets.get({ namespace: NS, name: 'eu-1-served-credentials-1' })).toBeUndefined();
  });

  it('a lost instance is re-created through an unserved status, so no verdict carries over', async () => {
    const { h } = await world();
    await h.seed('eu-1');
    await h.reconcile('eu-1');
    const seen: Array<string | undefined> = [];
    const off = h.store.proxies.watch((ev) => seen.push(ev.object.status?.address));
    h.fake.loseInstance(h.proxy('eu-1')!.status!.providerID!);
    await h.reconcile('eu-1');
    off();
    expect(seen).toContain(undefined);
    expect(h.proxy('eu-1')!.status).toMatchObject({ phase: 'Ready', address: expect.any(String) });
  });
});

describe('drain before delete', () => {
  it('deletes the old instance only once its leases are released', async () => {
    const { h, leases, clock } = await world();
    await h.seed('eu-1');
    await h.reconcile('eu-1');
    const old = h.proxy('eu-1')!.status!.providerID!;
    leases.set(`${NS}/eu-1|${old}`, 2);
    await editSpec(h, 'eu-1', 'z2');
    await h.reconcile('eu-1');
    await passHealth(h, 'eu-1');
    const res = await h.reconcile('eu-1');
    expect(res.requeueAfter).toBe(5_000);
    const p = h.proxy('eu-1')!;
    expect(p.status!.phase).toBe('Ready');
    expect(p.status!.draining).toEqual([
      {
        providerID: old,
        address: expect.any(String),
        port: 3128,
        credentialsGeneration: 1,
        since: expect.any(String),
      },
    ]);
    expect(h.fake.instances.has(old)).toBe(true);

    clock.advance(60_000);
    await h.reconcile('eu-1');
    expect(h.fake.instances.has(old)).toBe(true);
    leases.set(`${NS}/eu-1|${old}`, 0);
    await untilQuiet(h, 'eu-1');
    expect(h.fake.instances.has(old)).toBe(false);
    expect(h.proxy('eu-1')!.status!.draining).toBeUndefined();
  });

  it('deletes it at the drain timeout even with leases left', async () => {
    const { h, leases, clock } = await world({ drainTimeoutMs: 30_000 });
    await h.seed('eu-1');
    await h.reconcile('eu-1');
    const old = h.proxy('eu-1')!.status!.providerID!;
    leases.set(`${NS}/eu-1|${old}`, 1);
    await editSpec(h, 'eu-1', 'z2');
    await h.reconcile('eu-1');
    await passHealth(h, 'eu-1');
    await h.reconcile('eu-1');
    clock.advance(29_000);
    expect((await h.reconcile('eu-1')).requeueAfter).toBe(1_000);
    expect(h.fake.instances.has(old)).toBe(true);
    clock.advance(1_000);
    await untilQuiet(h, 'eu-1');
    expect(h.fake.instances.has(old)).toBe(false);
  });
});

describe('surge limit', () => {
  it('replaces at most the limit per provider at once; the others wait, then go in turn', async () => {
    const { h } = await world({ surge: 2 });
    const names = ['a', 'b', 'c', 'd', 'e'];
    for (const n of names) {
      await h.seed(n);
      await h.reconcile(n);
    }
    for (const n of names) await editSpec(h, n, 'z2');
    for (const n of names) await h.reconcile(n);
    const replacing = () => names.filter((n) => h.proxy(n)!.status!.pending);
    expect(replacing()).toEqual(['a', 'b']);
    for (const n of ['c', 'd', 'e']) {
      const p = h.proxy(n)!;
      expect(p.status!.phase).toBe('Ready');
      expect(p.status!.message).toBe('waiting for a replacement slot (2 of 2 replacing on provider "fake")');
    }
    // A passes; its slot goes to the longest waiter (c), not to whoever asks first.
    await passHealth(h, 'a');
    await h.reconcile('a');
    await h.reconcile('e');
    expect(h.proxy('e')!.status!.pending).toBeUndefined();
    await h.reconcile('c');
    expect(replacing()).toEqual(['b', 'c']);
    for (const n of names) {
      if (h.proxy(n)!.status!.pending) await passHealth(h, n);
    }
    for (let round = 0; round < 6; round++) {
      for (const n of names) {
        await h.reconcile(n);
        expect(replacing().length).toBeLessThanOrEqual(2);
        if (h.proxy(n)!.status!.pending && !h.proxy(n)!.status!.replacementHealth?.healthy)
          await passHealth(h, n);
      }
    }
    for (const n of names) {
      const p = h.proxy(n)!;
      expect(p.status!.phase, n).toBe('Ready');
      expect(h.fake.instances.get(p.status!.providerID!)!.request.zone, n).toBe('z2');
    }
    expect(h.fake.instances.size).toBe(5);
  });

  it('defaults to 10 % of the provider\u2019s proxies, at least 1', async () => {
    const { h } = await world();
    const names = Array.from({ length: 25 }, (_, i) => `p${i}`);
    for (const n of names) {
      await h.seed(n);
      await h.reconcile(n);
    }
    for (const n of names) await editSpec(h, n, 'z2');
    for (const n of names) await h.reconcile(n);
    expect(names.filter((n) => h.proxy(n)!.status!.pending)).toHaveLength(2);
  });
});

describe('failures keep what works', () => {
  it('a permanent error on a spec edit keeps the old instance serving, Ready, and is not retried', async () => {
    const { h } = await world();
    await h.seed('eu-1');
    await h.reconcile('eu-1');
    const old = h.proxy('eu-1')!.status!;
    h.fake.fail('create', { errorClass: 'Permanent', message: 'machine type "huge" does not exist' });
    const p0 = h.proxy('eu-1')!;
    await h.store.proxies.update({
      ...p0,
      spec: { ...p0.spec, placement: { zone: 'z1', machineType: 'huge' } },
    });
    expect(await h.reconcile('eu-1')).toEqual({});
    const p = h.proxy('eu-1')!;
    expect(p.status).toMatchObject({ phase: 'Ready', providerID: old.providerID, address: old.address });
    expect(condition(p, 'Provisioned')).toMatchObject({
      status: 'False',
      reason: 'ProvisioningFailed',
      message: 'machine type "huge" does not exist',
    });
    const creates = h.fake.calls.create;
    await h.reconcile('eu-1');
    expect(h.fake.calls.create).toBe(creates);
    // An edit of a Secret it reads (no new generation) tries again, and fails again.
    const auth = h.store.secrets.get({ namespace: NS, name: 'eu-1-auth' })!;
    await h.store.secrets.delete({ namespace: NS, name: 'eu-1-auth' });
    await h.seedSecret({
      metadata: { ...auth.metadata, resourceVersion: undefined },
      data: { ...auth.data, password: Buffer.from('another-password').toString('base64') },
    } as never);
    await h.reconcile('eu-1');
    expect(h.fake.calls.create).toBe(creates + 1);
    await h.reconcile('eu-1');
    expect(h.fake.calls.create).toBe(creates + 1);
    // The next edit tries again.
    h.fake.clearFaults();
    await editSpec(h, 'eu-1', 'z2');
    await h.reconcile('eu-1');
    expect(h.proxy('eu-1')!.status!.pending).toBeDefined();
  });

  it('deleting a Proxy mid-replacement deletes both instances', async () => {
    const { h } = await world();
    await h.seed('eu-1');
    await h.reconcile('eu-1');
    await editSpec(h, 'eu-1', 'z2');
    await h.reconcile('eu-1');
    expect(h.fake.instances.size).toBe(2);
    await h.store.proxies.delete({ namespace: NS, name: 'eu-1' });
    await untilQuiet(h, 'eu-1');
    expect(h.proxy('eu-1')).toBeUndefined();
    expect(h.fake.instances.size).toBe(0);
  });

  it('deleting a Proxy while an instance drains deletes it too', async () => {
    const { h, leases } = await world();
    await h.seed('eu-1');
    await h.reconcile('eu-1');
    leases.set(`${NS}/eu-1|${h.proxy('eu-1')!.status!.providerID}`, 1);
    await editSpec(h, 'eu-1', 'z2');
    await h.reconcile('eu-1');
    await passHealth(h, 'eu-1');
    await h.reconcile('eu-1');
    expect((h.proxy('eu-1') as ProxyObject).status!.draining).toHaveLength(1);
    await h.store.proxies.delete({ namespace: NS, name: 'eu-1' });
    await untilQuiet(h, 'eu-1');
    expect(h.fake.instances.size).toBe(0);
  });
});
