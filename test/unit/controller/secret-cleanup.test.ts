/**
 * Deleting a Proxy removes its generated `<proxy>-auth` Secret before the finalizer is released,
 * so a crash at any point of that sequence still converges on a retry (standalone mode has no
 * owner-reference GC to clean up after us).
 */
import { describe, expect, it } from 'vitest';
import { FINALIZER } from '../../../src/api/constants.ts';
import type { ObjectStore } from '../../../src/runtime/store.ts';
import { createHarness, type Harness, NS, untilQuiet } from '../../support/controller/harness.ts';

const AUTH = { namespace: NS, name: 'eu-1-auth' };

type Fault = 'secretDeleteBefore' | 'secretDeleteAfter' | 'removeFinalizerBefore';

/** Store wrapper that "crashes" once at the armed point: before a call, or after it took effect. */
function faulty(armed: Set<Fault>, order: string[]) {
  return (inner: ObjectStore): ObjectStore => {
    const crash = (f: Fault) => {
      if (!armed.delete(f)) return;
      throw new Error(`crash at ${f}`);
    };
    const secrets: ObjectStore['secrets'] = {
      get: (k) => inner.secrets.get(k),
      read: (k, o) => inner.secrets.read(k, o),
      create: (s, o) => inner.secrets.create(s, o),
      addLabels: (k, l, o) => inner.secrets.addLabels(k, l, o),
      watch: (h) => inner.secrets.watch(h),
      synced: (s) => inner.secrets.synced(s),
      delete: async (k, o) => {
        crash('secretDeleteBefore');
        await inner.secrets.delete(k, o);
        order.push(`secrets.delete ${k.name}`);
        crash('secretDeleteAfter');
      },
    };
    const proxies = Object.create(inner.proxies) as ObjectStore['proxies'];
    proxies.removeFinalizer = async (obj, fin, o) => {
      crash('removeFinalizerBefore');
      const out = await inner.proxies.removeFinalizer(obj, fin, o);
      order.push(`removeFinalizer ${obj.metadata.name}`);
      return out;
    };
    return { ...inner, proxies, secrets };
  };
}

describe.each(['memory', 'embedded'] as const)('generated credentials cleanup on the %s store', (backend) => {
  async function deletingProxy(armed: Set<Fault>, order: string[]): Promise<Harness> {
    const h = await createHarness({ backend, wrap: faulty(armed, order) });
    await h.seed('eu-1');
    await h.reconcile('eu-1');
    expect(h.proxy('eu-1')?.metadata.finalizers).toContain(FINALIZER);
    expect(await h.store.secrets.read(AUTH)).toBeDefined();
    await h.store.proxies.delete({ namespace: NS, name: 'eu-1' });
    return h;
  }

  const secretGone = async (h: Harness) =>
    expect(h.store.secrets.read(AUTH)).rejects.toMatchObject({ reason: 'NotFound' });

  it('deletes the Secrets before it releases the finalizer', async () => {
    const order: string[] = [];
    const h = await deletingProxy(new Set(), order);
    await untilQuiet(h, 'eu-1');
    expect(order).toEqual([
      'secrets.delete eu-1-auth',
      'secrets.delete eu-1-served-credentials-1',
      'removeFinalizer eu-1',
    ]);
    expect(h.proxy('eu-1')).toBeUndefined();
    await secretGone(h);
  });

  it('a crash before the Secret is deleted keeps the finalizer; the retry converges', async () => {
    const armed = new Set<Fault>(['secretDeleteBefore']);
    const h = await deletingProxy(armed, []);
    // Reconcile until the crash fires (the instance delete is polled first).
    for (let i = 0; i < 10 && armed.size > 0; i++) await h.attempt('eu-1');
    expect(armed.size).toBe(0);
    expect(h.proxy('eu-1')?.metadata.finalizers).toContain(FINALIZER);
    expect(await h.store.secrets.read(AUTH)).toBeDefined();
    await untilQuiet(h, 'eu-1');
    expect(h.proxy('eu-1')).toBeUndefined();
    await secretGone(h);
  });

  for (const fault of ['secretDeleteAfter', 'removeFinalizerBefore'] as const) {
    it(`a crash after the Secret deletion (${fault}) leaves the Proxy for a retry that converges`, async () => {
      const armed = new Set<Fault>([fault]);
      const h = await deletingProxy(armed, []);
      for (let i = 0; i < 10 && armed.size > 0; i++) await h.attempt('eu-1');
      expect(armed.size).toBe(0);
      // Secret gone, finalizer still there: nothing leaks, the Proxy waits for the retry.
      await secretGone(h);
      expect(h.proxy('eu-1')?.metadata.finalizers).toContain(FINALIZER);
      await untilQuiet(h, 'eu-1');
      expect(h.proxy('eu-1')).toBeUndefined();
      await secretGone(h);
    });
  }

  it('never deletes a <proxy>-auth Secret owned by another Proxy', async () => {
    const h = await createHarness({ backend });
    await h.seed('eu-1');
    await h.reconcile('eu-1');
    const s = await h.store.secrets.read(AUTH);
    // Another Proxy of the same name took the Secret over (a stale view of this one remains).
    await h.store.secrets.delete(AUTH);
    const foreign = {
      ...s,
      metadata: {
        ...s.metadata,
        ownerReferences: (s.metadata.ownerReferences ?? []).map((o) => ({ ...o, uid: 'another-uid' })),
      },
    };
    delete foreign.metadata.resourceVersion;
    delete foreign.metadata.uid;
    delete foreign.metadata.creationTimestamp;
    await h.store.secrets.create(foreign);
    await h.store.proxies.delete({ namespace: NS, name: 'eu-1' });
    await untilQuiet(h, 'eu-1');
    expect(h.proxy('eu-1')).toBeUndefined();
    const left = await h.store.secrets.read(AUTH);
    expect(left.metadata.ownerReferences?.[0]?.uid).toBe('another-uid');
  });
});
