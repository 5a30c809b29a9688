import { Registry } from 'prom-client';
import { describe, expect, it, vi } from 'vitest';
import { silentLogger } from '../../../src/log/index.ts';
import { OrphanSweeper } from '../../../src/orphans/sweeper.ts';
import type { Provider } from '../../../src/provider/contract.ts';
import { createMemoryStore } from '../../../src/runtime/memory.ts';
import { FakeClock } from '../../support/clock.ts';
import { FakeProvider } from '../../support/fake-provider.ts';
import { captureLog } from '../../support/log.ts';

const MIN_AGE = 10 * 60_000;
const ctx = { signal: new AbortController().signal, log: silentLogger() };
const creds = { username: 'u', password: 'p' };
const INSTALLATION = 'installation-a';

async function instance(p: FakeProvider, name: string, uid: string | undefined, namespace = 'crawl') {
  const inst = await p.create(ctx, {
    name,
    uid: uid ?? '',
    namespace,
    proxyName: name,
    port: 3128,
    credentials: creds,
    installation: INSTALLATION,
  });
  if (uid === undefined) {
    const stored = p.instances.get(inst.id);
    if (stored) delete stored.uid;
  }
  return inst.id;
}

function setup(opts: { proxyNamespace?: string } = {}) {
  const clock = new FakeClock();
  const start = clock.now();
  const fake = new FakeProvider({ name: 'fake', now: () => start });
  const store = createMemoryStore({ clock });
  const registry = new Registry();
  const providers: Array<[string, Provider]> = [['fake', fake]];
  const gc = new OrphanSweeper({
    store,
    providers: () => providers,
    intervalMs: 60_000,
    minAgeMs: MIN_AGE,
    clock,
    registry,
    installation: INSTALLATION,
    ...opts,
  });
  return { clock, fake, store, gc, registry, providers };
}

describe('orphan sweep', () => {
  it('deletes only old instances whose Proxy UID no longer exists', async () => {
    const { clock, fake, store, gc, registry } = setup();
    const owned = store.seedProxy({
      metadata: { name: 'owned', namespace: 'crawl' },
      spec: { provider: 'fake' },
    });
    const ownedId = await instance(fake, 'px-owned', owned.metadata.uid);
    const orphanId = await instance(fake, 'px-orphan', 'uid-of-a-deleted-proxy');
    const unlabelledId = await instance(fake, 'px-foreign', undefined);

    // Too young: nothing goes.
    clock.advance(MIN_AGE - 1);
    let res = await gc.sweep(new AbortController().signal);
    expect(res.deleted).toEqual({});

    clock.advance(2);
    res = await gc.sweep(new AbortController().signal);
    expect(res.deleted).toEqual({ fake: [orphanId] });
    expect(fake.instances.has(ownedId)).toBe(true);
    expect(fake.instances.has(unlabelledId)).toBe(true);
    expect(fake.instances.has(orphanId)).toBe(false);
    expect(await registry.getSingleMetricAsString('proxy_operator_gc_deleted_total')).toMatch(
      /proxy_operator_gc_deleted_total\{provider="fake"\} 1/,
    );
  });

  it('never touches instances a Proxy is retiring, or whose Proxy is being deleted', async () => {
    const { clock, fake, store, gc } = setup();
    const deleting = store.seedProxy({
      metadata: { name: 'going', namespace: 'crawl', finalizers: ['crawl.example.com/instance-cleanup'] },
      spec: { provider: 'fake' },
    });
    await store.proxies.delete({ namespace: 'crawl', name: 'going' });
    const deletingId = await instance(fake, 'px-going', deleting.metadata.uid);
    const retiredId = await instance(fake, 'px-old', 'some-other-uid');
    store.seedProxy({
      metadata: { name: 'rotating', namespace: 'crawl' },
      spec: { provider: 'fake' },
      status: { retiring: [retiredId] },
    });
    clock.advance(MIN_AGE * 2);
    const res = await gc.sweep(new AbortController().signal);
    expect(res.deleted).toEqual({});
    expect(fake.instances.has(deletingId)).toBe(true);
    expect(fake.instances.has(retiredId)).toBe(true);
  });

  it('skips a provider whose listing fails and still sweeps the others', async () => {
    const { clock, fake, gc, providers } = setup();
    const broken = new FakeProvider({ name: 'broken' });
    broken.fail('listByTag', { errorClass: 'Transient', message: 'backend down' });
    providers.unshift(['broken', broken]);
    const orphanId = await instance(fake, 'px-orphan', 'gone-uid');
    clock.advance(MIN_AGE + 1);
    const res = await gc.sweep(new AbortController().signal);
    expect(res.failed.broken).toMatch(/backend down/);
    expect(res.deleted).toEqual({ fake: [orphanId] });
  });

  it('with --proxy-namespace only collects instances of that namespace', async () => {
    const { clock, fake, gc } = setup({ proxyNamespace: 'crawl' });
    const mine = await instance(fake, 'px-mine', 'gone-1', 'crawl');
    const theirs = await instance(fake, 'px-theirs', 'gone-2', 'other-team');
    clock.advance(MIN_AGE + 1);
    const res = await gc.sweep(new AbortController().signal);
    expect(res.deleted).toEqual({ fake: [mine] });
    expect(fake.instances.has(theirs)).toBe(true);
  });

  it('as a runnable sweeps at once, then once per interval of the injected clock', async () => {
    const { clock, fake, gc } = setup();
    const first = await instance(fake, 'px-first', 'gone-1');
    clock.advance(MIN_AGE + 1);
    const ctrl = new AbortController();
    const running = gc.start(ctrl.signal);
    await vi.waitFor(() => expect(fake.instances.has(first)).toBe(false));
    // The sweep is over once the runnable waits for its next period.
    await vi.waitFor(() => expect(clock.pendingTimers()).toBe(1));

    const second = await instance(fake, 'px-second', 'gone-2');
    clock.advance(60_000 - 1);
    expect(clock.pendingTimers()).toBe(1); // the next sweep is not due yet
    expect(fake.instances.has(second)).toBe(true);
    clock.advance(1);
    await vi.waitFor(() => expect(fake.instances.has(second)).toBe(false));

    ctrl.abort();
    await running;
    expect(clock.pendingTimers()).toBe(0);
  });

  it('with interval 0 is off: never lists or deletes, and ends when the signal aborts', async () => {
    const clock = new FakeClock();
    const start = clock.now();
    const fake = new FakeProvider({ name: 'fake', now: () => start });
    const orphan = await instance(fake, 'px-orphan', 'gone');
    clock.advance(MIN_AGE + 1);
    const listed = vi.spyOn(fake, 'listByTag');
    const { log, lines } = captureLog('info');
    const gc = new OrphanSweeper({
      store: createMemoryStore({ clock }),
      providers: () => [['fake', fake]],
      intervalMs: 0,
      minAgeMs: MIN_AGE,
      clock,
      log,
      installation: INSTALLATION,
    });
    const ctrl = new AbortController();
    let ended = false;
    const running = gc.start(ctrl.signal).then(() => {
      ended = true;
    });
    for (let i = 0; i < 20; i++) {
      clock.advance(60_000);
      await new Promise((r) => setImmediate(r));
    }
    expect(listed).not.toHaveBeenCalled();
    expect(fake.instances.has(orphan)).toBe(true);
    expect(ended).toBe(false); // a runnable that stays up: it is off, not failed
    expect(lines.some((l) => /--gc-interval 0/.test(String(l.msg)))).toBe(true);
    ctrl.abort();
    await running;
  });

  it('a second collector on the same registry shares the deletion counter', async () => {
    const { clock, fake, store, gc, registry, providers } = setup();
    const again = new OrphanSweeper({
      store,
      providers: () => providers,
      intervalMs: 60_000,
      minAgeMs: MIN_AGE,
      clock,
      registry,
      installation: INSTALLATION,
    });
    await instance(fake, 'px-a', 'gone-a');
    clock.advance(MIN_AGE + 1);
    await gc.sweep(new AbortController().signal);
    await instance(fake, 'px-b', 'gone-b');
    clock.advance(MIN_AGE + 1);
    await again.sweep(new AbortController().signal);
    expect(await registry.getSingleMetricAsString('proxy_operator_gc_deleted_total')).toMatch(
      /proxy_operator_gc_deleted_total\{provider="fake"\} 2/,
    );
  });
});
