import { describe, expect, it } from 'vitest';
import type { CreateRequest } from '../../../src/provider/contract.ts';
import { classify } from '../../../src/provider/errors.ts';
import { FakeProvider } from '../../support/fake-provider.ts';
import { callContext } from '../../support/provider-calls.ts';

const ctx = callContext;
const req = (name: string): CreateRequest => ({
  name,
  uid: 'uid-1',
  namespace: 'ns',
  proxyName: 'p',
  port: 3128,
  credentials: { username: 'u', password: 'p' },
});

describe('FakeProvider (shared test double)', () => {
  it('creates idempotently by name and counts Pending down to Running with an address', async () => {
    const f = new FakeProvider({ pendingGets: 2 });
    const a = await f.create(ctx(), req('px-a'));
    const again = await f.create(ctx(), req('px-a'));
    expect(again.id).toBe(a.id);
    expect(f.created).toBe(1);
    expect(a.state).toBe('Pending');
    expect((await f.get(ctx(), a.id)).state).toBe('Pending');
    const running = await f.get(ctx(), a.id);
    expect(running).toMatchObject({ state: 'Running', uid: 'uid-1', namespace: 'ns' });
    expect(running.address).toBeTruthy();
    expect(await f.listByTag(ctx())).toHaveLength(1);
  });

  it('loses, deletes idempotently and answers NotFound', async () => {
    const f = new FakeProvider();
    const a = await f.create(ctx(), req('px-a'));
    f.loseInstance(a.id);
    await expect(f.get(ctx(), a.id)).rejects.toSatisfy((e) => classify(e) === 'NotFound');
    await f.delete(ctx(), a.id);
    expect(f.calls).toMatchObject({ create: 1, get: 1, delete: 1 });
  });

  it('injects faults by class and count, by function, and after the effect', async () => {
    const f = new FakeProvider();
    f.fail('create', { errorClass: 'QuotaExceeded', count: 1 });
    await expect(f.create(ctx(), req('px-a'))).rejects.toSatisfy((e) => classify(e) === 'QuotaExceeded');
    expect(f.instances.size).toBe(0);
    await f.create(ctx(), req('px-a'));
    f.fail('get', (call) => (call.n === 1 ? new Error('flaky') : undefined));
    await expect(f.get(ctx(), 'fake/px-a')).rejects.toThrow('flaky');
    await expect(f.get(ctx(), 'fake/px-a')).resolves.toMatchObject({ state: 'Running' });
    f.failAfter('delete', { errorClass: 'Transient', count: 1 });
    await expect(f.delete(ctx(), 'fake/px-a')).rejects.toThrow();
    expect(f.instances.size).toBe(0); // the delete happened; only the answer was lost
  });

  it('latency stops promptly when the signal aborts', async () => {
    const f = new FakeProvider({ latency: { get: 10_000 } });
    const ac = new AbortController();
    const started = Date.now();
    const p = f.get(ctx(ac.signal), 'fake/x');
    setTimeout(() => ac.abort(new Error('stop')), 20);
    await expect(p).rejects.toThrow('stop');
    expect(Date.now() - started).toBeLessThan(5_000);
  });

  it('check returns the settable result and never throws', async () => {
    const f = new FakeProvider();
    f.checkResult = [{ name: 'host-1', ready: false, reason: 'Unreachable' }];
    f.fail('check', { errorClass: 'Permanent' });
    expect(await f.check(ctx())).toEqual([{ name: 'host-1', ready: false, reason: 'Unreachable' }]);
  });
});
