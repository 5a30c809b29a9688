/**
 * Errors are attributed by origin: only a provider's failure becomes a provider condition;
 * a store or network failure of ours goes back to the work queue untouched.
 */
import { describe, expect, it } from 'vitest';
import { withErrorOrigin } from '../../../src/provider/decorators.ts';
import { classify, notFound, ProviderError } from '../../../src/provider/errors.ts';
import { isConflict, type ObjectStore } from '../../../src/runtime/store.ts';
import { condition, createHarness, NS } from '../../support/controller/harness.ts';
import { FakeProvider } from '../../support/fake-provider.ts';
import { callContext } from '../../support/provider-calls.ts';

/** A connection reset the way undici reports one: a plain Error with a code. */
const reset = () => Object.assign(new Error('read ECONNRESET'), { code: 'ECONNRESET' });

describe('withErrorOrigin', () => {
  it('turns every throw into a ProviderError, keeping message, class and the error itself as cause', async () => {
    const fake = new FakeProvider({ name: 'fake' });
    const raw = reset();
    fake.fail('get', () => raw);
    const p = withErrorOrigin(fake);
    const err = await p.get(callContext(), 'fake/x').catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ProviderError);
    expect((err as ProviderError).message).toBe('read ECONNRESET');
    expect((err as ProviderError).errorClass).toBe('Transient');
    expect((err as ProviderError).provider).toBe('fake');
    expect((err as ProviderError).op).toBe('get');
    expect((err as Error).cause).toBe(raw);
  });

  it('passes a classified error through unchanged', async () => {
    const fake = new FakeProvider({ name: 'fake' });
    const gone = notFound('gone');
    fake.fail('get', () => gone);
    await expect(withErrorOrigin(fake).get(callContext(), 'fake/x')).rejects.toBe(gone);
    // A classified error behind a cause keeps its class.
    fake.fail('get', () => new Error('wrapped', { cause: notFound('inner') }));
    const err = await withErrorOrigin(fake)
      .get(callContext(), 'fake/x')
      .catch((e: unknown) => e);
    expect(classify(err)).toBe('NotFound');
    expect((err as ProviderError).errorClass).toBe('NotFound');
  });
});

describe('reconciler: errors by origin', () => {
  /** A store whose next `patchStatus` fails with a connection reset. */
  const resetOnce = (armed: { on: boolean }) => (s: ObjectStore) => {
    const proxies = Object.create(s.proxies) as ObjectStore['proxies'];
    proxies.patchStatus = async (key, status, opts) => {
      if (armed.on) {
        armed.on = false;
        throw reset();
      }
      return s.proxies.patchStatus(key, status, opts);
    };
    return { ...s, proxies };
  };

  it('a status write failing with a network error is not reported as a ProviderError', async () => {
    const armed = { on: false };
    const h = await createHarness({ wrap: resetOnce(armed) });
    await h.seed('eu-1');
    armed.on = true;
    const { error } = await h.attempt('eu-1');
    expect(armed.on).toBe(false);
    expect(error).toBeInstanceOf(Error);
    expect(error).not.toBeInstanceOf(ProviderError);
    expect((error as Error).message).toBe('read ECONNRESET');
    const p = h.proxy('eu-1')!;
    expect(condition(p, 'Provisioned')?.reason).not.toBe('ProviderError');
    expect(p.status?.message ?? '').not.toContain('ECONNRESET');
    // The instance was created; the next pass re-finds it (idempotent create) and records it.
    await h.reconcile('eu-1');
    expect(h.proxy('eu-1')!.status?.phase).toBe('Ready');
    expect(h.fake.created).toBe(1);
  });

  it('a provider failure still is one', async () => {
    const h = await createHarness();
    await h.seed('eu-1');
    h.fake.fail('create', () => reset());
    const { error } = await h.attempt('eu-1');
    expect(error).toBeDefined();
    expect(condition(h.proxy('eu-1'), 'Provisioned')).toMatchObject({
      reason: 'ProviderError',
      message: 'read ECONNRESET',
    });
  });

  it('a Conflict on the metadata write goes back to the queue; the next pass starts fresh', async () => {
    let race = false;
    const h = await createHarness({
      wrap: (s) => {
        const proxies = Object.create(s.proxies) as ObjectStore['proxies'];
        proxies.update = async (obj, opts) => {
          if (race) {
            race = false;
            // Another writer moves the object between our read and our write.
            const cur = await s.proxies.read(obj.metadata);
            await s.proxies.update({ ...cur, metadata: { ...cur.metadata, labels: { moved: 'yes' } } });
          }
          return s.proxies.update(obj, opts);
        };
        return { ...s, proxies };
      },
    });
    await h.seed('eu-1');
    race = true;
    const { error } = await h.attempt('eu-1');
    expect(isConflict(error)).toBe(true);
    expect(h.fake.calls.create).toBe(0);
    await h.reconcile('eu-1');
    const p = h.proxy('eu-1')!;
    expect(p.status?.phase).toBe('Ready');
    expect(p.metadata.labels).toEqual({ moved: 'yes' });
    expect(h.store.proxies.get({ namespace: NS, name: 'eu-1' })?.status?.providerID).toBeDefined();
  });
});
