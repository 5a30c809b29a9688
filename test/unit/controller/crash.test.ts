import { describe, expect, it } from 'vitest';
import { API_VERSION, FINALIZER, PROXY_KIND } from '../../../src/api/constants.ts';
import { createProxyReconciler, type ProxyReconciler } from '../../../src/controller/reconciler.ts';
import type { Provider } from '../../../src/provider/contract.ts';
import type { ObjectStore } from '../../../src/runtime/store.ts';
import { Chaos } from '../../support/controller/chaos.ts';
import { type Backend, createTestStore, NS, testOptions } from '../../support/controller/harness.ts';
import { FakeProvider } from '../../support/fake-provider.ts';
import { seededRandom, TEST_SEED } from '../../support/random.ts';

/**
 * Plays the health engine and the lease store around the reconciler: a pending replacement
 * with an address is passed (status.replacementHealth) on a coin flip per round, and an
 * instance that starts draining may hold a lease for a few rounds. Records every broken rule:
 * a switch to an instance never passed, or an instance deleted while a lease on it is live.
 */
class Surroundings {
  /** Live leases: providerID → rounds left. */
  readonly leases = new Map<string, number>();
  readonly passed = new Set<string>();
  readonly violations: string[] = [];
  private readonly rnd: () => number;
  private readonly store: ObjectStore;
  constructor(seed: number, store: ObjectStore) {
    this.store = store;
    this.rnd = seededRandom(seed ^ 0x5eed);
  }
  leasesOn = (_key: string, id: string): number => ((this.leases.get(id) ?? 0) > 0 ? 1 : 0);
  /** One round of the world outside the reconciler. */
  async tick(): Promise<void> {
    for (const [id, left] of this.leases) {
      if (left <= 1) this.leases.delete(id);
      else this.leases.set(id, left - 1);
    }
    for (const p of this.store.proxies.list()) {
      const pending = p.status?.pending;
      if (pending?.address && !this.passed.has(pending.providerID) && this.rnd() < 0.5) {
        this.passed.add(pending.providerID);
        await this.store.proxies.patchStatus(
          { namespace: NS, name: p.metadata.name },
          { replacementHealth: { providerID: pending.providerID, healthy: true } },
        );
      }
    }
  }
  /** Watches switches and drains. */
  follow(): () => void {
    return this.store.proxies.watch((ev) => {
      const before = ev.old?.status;
      const after = ev.object.status;
      if (after?.providerID && before?.providerID && after.providerID !== before.providerID) {
        if (!this.passed.has(after.providerID) && before.pending?.providerID === after.providerID) {
          this.violations.push(`${ev.object.metadata.name} switched to ${after.providerID} before it passed`);
        }
      }
      for (const d of after?.draining ?? []) {
        if (!(before?.draining ?? []).some((x) => x.providerID === d.providerID) && this.rnd() < 0.5) {
          this.leases.set(d.providerID, 1 + Math.floor(this.rnd() * 4));
        }
      }
    });
  }
  /** Wraps delete: deleting an instance under a live lease (its Proxy not being deleted) is a violation. */
  guard(provider: Provider, deleting: (id: string) => boolean): Provider {
    return {
      ...provider,
      delete: async (ctx, id) => {
        if ((this.leases.get(id) ?? 0) > 0 && !deleting(id))
          this.violations.push(`deleted ${id} under a live lease`);
        return provider.delete(ctx, id);
      },
    };
  }
}

interface World {
  store: ObjectStore;
  fake: FakeProvider;
  chaos: Chaos;
  around: Surroundings;
  reconciler: () => ProxyReconciler;
  restart: () => void;
}

async function world(seed: number, backend: Backend = 'memory'): Promise<World> {
  const store = await createTestStore(backend);
  const fake = new FakeProvider({ name: 'fake', pendingGets: 1 });
  const chaos = new Chaos(seed);
  const around = new Surroundings(seed, store);
  const proxyDeleting = (id: string) =>
    store.proxies
      .list()
      .some((p) => p.metadata.deletionTimestamp && fake.instances.get(id)?.uid === p.metadata.uid);
  const providers = new Map([['fake', around.guard(chaos.wrapProvider(fake), proxyDeleting)]]);
  const make = () =>
    createProxyReconciler({
      store: chaos.wrapStore(store),
      providers,
      // Health-gated switches and drains, as in production.
      options: { ...testOptions, healthGate: true },
      leasesOn: around.leasesOn,
      installation: 'crash-test',
    });
  let rec = make();
  return { store, fake, chaos, around, reconciler: () => rec, restart: () => (rec = make()) };
}

/** Reconcile every key until all are quiet; a kill is followed by a "restart" of the reconciler. */
async function converge(w: World, keys: string[], maxRounds = 200): Promise<void> {
  let pending = new Set(keys);
  for (let round = 0; round < maxRounds && pending.size > 0; round++) {
    await w.around.tick();
    const next = new Set<string>();
    for (const key of pending) {
      const signal = w.chaos.begin();
      try {
        const res = await w.reconciler().reconcile(key, signal);
        if (res.requeueAfter) next.add(key);
      } catch {
        if (signal.aborted) w.restart();
        next.add(key);
      }
    }
    pending = next;
  }
  if (pending.size > 0) {
    const [first] = pending;
    const p = w.store.proxies.get({ namespace: NS, name: first!.split('/')[1]! });
    let detail = '';
    try {
      detail = JSON.stringify(await w.reconciler().reconcile(first!, new AbortController().signal));
    } catch (err) {
      detail = String(err);
    }
    throw new Error(`not converged: ${pending.size} left, e.g. ${first}: ${JSON.stringify(p)} → ${detail}`);
  }
}

function assertOneInstancePerProxy(w: World, names: string[]): void {
  const live = new Map(w.fake.instances);
  for (const name of names) {
    const p = w.store.proxies.get({ namespace: NS, name })!;
    expect(p.status?.phase, name).toBe('Ready');
    expect(p.status?.retiring, name).toBeUndefined();
    const mine = w.fake.instancesOf(p.metadata.uid!);
    expect(
      mine.map((i) => i.id),
      name,
    ).toEqual([p.status!.providerID]);
    expect(mine[0]!.address).toBe(p.status!.address);
    live.delete(p.status!.providerID!);
  }
  expect([...live.keys()], 'leaked instances').toEqual([]);
}

describe('reconciler crash safety', () => {
  it.each(['memory', 'embedded'] as const)(
    `100 Proxies through create, replacement and deletion with random kills, %s store: no leak, no duplicate (TEST_SEED=${TEST_SEED})`,
    async (backend) => {
      const w = await world(TEST_SEED, backend);
      const unfollow = w.around.follow();
      const names = Array.from({ length: 100 }, (_, i) => `p-${i}`);
      const keys = names.map((n) => `${NS}/${n}`);
      for (const name of names) {
        await w.store.proxies.create({
          apiVersion: API_VERSION,
          kind: PROXY_KIND,
          metadata: { name, namespace: NS },
          spec: { provider: 'fake', placement: { zone: 'a' } },
        });
      }

      await converge(w, keys);
      assertOneInstancePerProxy(w, names);
      expect(w.fake.created).toBe(100); // every create after a kill re-found its instance

      // Replacement; a third of the Proxies change again while their replacement is in flight.
      for (const name of names) {
        const p = w.store.proxies.get({ namespace: NS, name })!;
        await w.store.proxies.update({ ...p, spec: { ...p.spec, placement: { zone: 'b' } } });
      }
      const first = new Set<string>();
      for (const key of keys.slice(0, 34)) {
        const signal = w.chaos.begin();
        await w
          .reconciler()
          .reconcile(key, signal)
          .catch(() => w.restart());
        first.add(key);
      }
      for (const name of names.slice(0, 34)) {
        const p = w.store.proxies.get({ namespace: NS, name })!;
        await w.store.proxies.update({ ...p, spec: { ...p.spec, placement: { zone: 'c' } } });
      }
      await converge(w, keys);
      assertOneInstancePerProxy(w, names);
      for (const name of names) {
        const p = w.store.proxies.get({ namespace: NS, name })!;
        const zone = names.indexOf(name) < 34 ? 'c' : 'b';
        expect(w.fake.instances.get(p.status!.providerID!)!.request.zone, name).toBe(zone);
      }

      for (const name of names) await w.store.proxies.delete({ namespace: NS, name });
      await converge(w, keys);
      expect(w.store.proxies.list()).toEqual([]);
      expect([...w.fake.instances.keys()], 'leaked instances').toEqual([]);
      expect(w.chaos.kills).toBeGreaterThan(50);
      // The double spec change went through the search for unrecorded instances.
      expect(w.fake.calls.listByTag).toBeGreaterThan(0);
      // Nothing of ours is left holding anything.
      expect(w.store.proxies.list().some((p) => p.metadata.finalizers?.includes(FINALIZER))).toBe(false);
      // Every switch waited for its health pass, and no instance went while a lease on it lived.
      unfollow();
      expect(w.around.violations).toEqual([]);
      expect(w.around.passed.size).toBeGreaterThanOrEqual(100);
    },
  );

  it('a kill right after every provider create still ends with exactly one instance', async () => {
    const w = await world(7);
    w.chaos.rate = 0;
    await w.store.proxies.create({
      apiVersion: API_VERSION,
      kind: PROXY_KIND,
      metadata: { name: 'solo', namespace: NS },
      spec: { provider: 'fake' },
    });
    w.fake.failAfter('create', { errorClass: 'Transient', count: 3 });
    await converge(w, [`${NS}/solo`]);
    expect(w.fake.created).toBe(1);
    assertOneInstancePerProxy(w, ['solo']);
  });
});
