/**
 * Two operators (installations) sharing one backend: each GC collects only its own orphans,
 * adopts the unlabelled instances of its own Proxies, and leaves unlabelled instances of
 * Proxies it does not know alone (reported, never deleted).
 */
import { describe, expect, it } from 'vitest';
import { silentLogger } from '../../../src/log/index.ts';
import { OrphanSweeper } from '../../../src/orphans/sweeper.ts';
import type { Provider } from '../../../src/provider/contract.ts';
import { createMemoryStore, type MemoryStore } from '../../../src/runtime/memory.ts';
import { FakeClock } from '../../support/clock.ts';
import { FakeProvider } from '../../support/fake-provider.ts';

const MIN_AGE = 10 * 60_000;
const ctx = { signal: new AbortController().signal, log: silentLogger() };
const sweep = (gc: OrphanSweeper) => gc.sweep(new AbortController().signal);

/** One shared backend, two installations each with its own store (cluster) and GC. */
function twoInstallations(provider?: (fake: FakeProvider) => Provider) {
  const clock = new FakeClock();
  const start = clock.now();
  const fake = new FakeProvider({ name: 'shared', now: () => start });
  const seen = provider ? provider(fake) : fake;
  const install = (installation: string) => {
    const store = createMemoryStore({ clock });
    const gc = new OrphanSweeper({
      store,
      providers: () => [['shared', seen]],
      intervalMs: 60_000,
      minAgeMs: MIN_AGE,
      clock,
      installation,
    });
    return { store, gc, installation };
  };
  return { clock, fake, a: install('installation-a'), b: install('installation-b') };
}

async function instance(fake: FakeProvider, name: string, uid: string, installation?: string) {
  const inst = await fake.create(ctx, {
    name,
    uid,
    namespace: 'crawl',
    proxyName: name,
    port: 3128,
    credentials: { username: 'u', password: 'p' },
    ...(installation ? { installation } : {}),
  });
  return inst.id;
}

function proxyOf(store: MemoryStore, name: string): string {
  const p = store.seedProxy({ metadata: { name, namespace: 'crawl' }, spec: { provider: 'shared' } });
  return p.metadata.uid as string;
}

describe('orphan sweep with two installations on one backend', () => {
  it("neither collects the other's instances, each collects its own orphans", async () => {
    const { clock, fake, a, b } = twoInstallations();
    const aLive = await instance(fake, 'px-a-live', proxyOf(a.store, 'a1'), a.installation);
    const bLive = await instance(fake, 'px-b-live', proxyOf(b.store, 'b1'), b.installation);
    const aOrphan = await instance(fake, 'px-a-orphan', 'deleted-proxy-of-a', a.installation);
    const bOrphan = await instance(fake, 'px-b-orphan', 'deleted-proxy-of-b', b.installation);
    clock.advance(MIN_AGE * 3);

    const resA = await sweep(a.gc);
    expect(resA.deleted).toEqual({ shared: [aOrphan] });
    expect([...fake.instances.keys()].sort()).toEqual([aLive, bLive, bOrphan].sort());

    const resB = await sweep(b.gc);
    expect(resB.deleted).toEqual({ shared: [bOrphan] });
    expect([...fake.instances.keys()].sort()).toEqual([aLive, bLive].sort());

    // Sweeping again changes nothing: each one's live instance is someone's.
    expect((await sweep(a.gc)).deleted).toEqual({});
    expect((await sweep(b.gc)).deleted).toEqual({});
    expect(fake.instances.size).toBe(2);
  });

  it('adopts the unlabelled instances of its own Proxies; the other installation leaves them alone', async () => {
    const { clock, fake, a, b } = twoInstallations();
    // Created before installations existed: no installation label.
    const uid = proxyOf(a.store, 'a1');
    const legacy = await instance(fake, 'px-a-legacy', uid);
    const stranger = await instance(fake, 'px-stranger', 'uid-nobody-knows');
    clock.advance(MIN_AGE * 3);

    // B first: neither is B's, so nothing is deleted or labelled; both are reported.
    const resB = await sweep(b.gc);
    expect(resB.deleted).toEqual({});
    expect(resB.adopted).toEqual({});
    expect(resB.unclaimed.shared?.sort()).toEqual([legacy, stranger].sort());

    const resA = await sweep(a.gc);
    expect(resA.adopted).toEqual({ shared: [legacy] });
    expect(resA.unclaimed).toEqual({ shared: [stranger] });
    expect(resA.deleted).toEqual({});
    expect(fake.instances.get(legacy)?.installation).toBe('installation-a');
    expect(fake.instances.get(stranger)?.installation).toBeUndefined();

    // Once A's Proxy is gone, the adopted instance is an orphan of A's — and never of B's.
    await a.store.proxies.delete({ namespace: 'crawl', name: 'a1' });
    expect((await sweep(b.gc)).deleted).toEqual({});
    expect((await sweep(a.gc)).deleted).toEqual({ shared: [legacy] });
    expect([...fake.instances.keys()]).toEqual([stranger]);
  });

  it('where the backend cannot relabel, treats an unlabelled instance as ours by its Proxy UID', async () => {
    // A provider without `adopt` (like kvm).
    const { clock, fake, a, b } = twoInstallations((f) => ({
      name: f.name,
      type: f.type,
      create: (c, r) => f.create(c, r),
      get: (c, id) => f.get(c, id),
      delete: (c, id) => f.delete(c, id),
      listByTag: (c) => f.listByTag(c),
    }));
    const uid = proxyOf(a.store, 'a1');
    const legacy = await instance(fake, 'px-a-legacy', uid);
    clock.advance(MIN_AGE * 3);
    const resA = await sweep(a.gc);
    expect(resA.adopted).toEqual({});
    expect(resA.unclaimed).toEqual({});
    expect(resA.deleted).toEqual({});
    expect((await sweep(b.gc)).deleted).toEqual({});
    expect(fake.instances.has(legacy)).toBe(true);
    expect(fake.calls.adopt).toBe(0);
  });
});
