/**
 * test/support/provider-contract — the cases every Provider must pass, whatever its backend:
 * create is idempotent by name (also concurrently), get answers NotFound for a gone instance
 * and Permanent for an ID that can never be valid, delete is idempotent, listByTag reads the
 * Proxy identity and the installation label back, a name another Proxy owns is Permanent, every failure is a classified
 * ProviderError, and an aborted call is a Transient error that changed nothing. The fake every reconciler test relies on runs the same
 * cases as local, gcp and kvm, so where it passes they pass (see docs/architecture.md).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  type CallContext,
  type CreateRequest,
  INSTANCE_STATES,
  type Instance,
  type Provider,
} from '../../src/provider/contract.ts';
import { classify, ERROR_CLASSES, type ErrorClass, ProviderError } from '../../src/provider/errors.ts';
import { callContext, TEST_CREDENTIALS } from './provider-calls.ts';

export interface ContractSubject {
  provider: Provider;
  /** A name no other test (or earlier run) uses; valid for this backend. */
  uniqueName(what: string): string;
  /** A CreateRequest for `name` with everything this backend needs (zone, image…). */
  request(name: string, over?: Partial<CreateRequest>): CreateRequest;
  /** A well-formed ID of an instance that does not exist. */
  missingID(): string;
  /** An ID this backend can never resolve (wrong shape). */
  malformedID: string;
  /** Makes every following backend call take at least `ms` (for mid-call cancellation). */
  slowDown?(ms: number): void;
  /** Undoes slowDown. */
  speedUp?(): void;
  close?(): Promise<void>;
}

export interface ContractOptions {
  /** Per-test timeout: real backends (kvm) create slowly. */
  timeoutMs?: number;
  /** The subject offers slowDown/speedUp, so cancellation in mid-call can be tested. */
  midCallAbort?: boolean;
}

async function rejection(p: Promise<unknown>): Promise<ProviderError> {
  const err = await p.then(
    () => new Error('expected a rejection, the call succeeded'),
    (e: unknown) => e,
  );
  // Every failure is a ProviderError whose own class and classify() agree: the reconciler
  // acts on the class (see docs/architecture.md, the Proxy state machine).
  expect(err).toBeInstanceOf(ProviderError);
  const pe = err as ProviderError;
  expect(ERROR_CLASSES).toContain(pe.errorClass);
  expect(classify(pe)).toBe(pe.errorClass);
  expect(pe.message).not.toContain(TEST_CREDENTIALS.password);
  return pe;
}

async function expectClass(p: Promise<unknown>, cls: ErrorClass): Promise<ProviderError> {
  const err = await rejection(p);
  expect(err.errorClass, err.message).toBe(cls);
  return err;
}

function aborted(): CallContext {
  const ac = new AbortController();
  ac.abort(new Error('caller gave up'));
  return callContext(ac.signal);
}

/** Registers the contract cases for the subject `setup` builds (once, in beforeAll). */
export function providerContract(
  label: string,
  setup: () => Promise<ContractSubject>,
  opts: ContractOptions = {},
): void {
  const timeout = opts.timeoutMs ?? 10_000;
  const ctx = () => callContext();
  let s: ContractSubject;
  const created = new Set<string>();
  const create = async (req: CreateRequest): Promise<Instance> => {
    const inst = await s.provider.create(ctx(), req);
    created.add(inst.id);
    return inst;
  };
  const listed = async (name: string) => (await s.provider.listByTag(ctx())).filter((i) => i.name === name);

  describe(`provider contract: ${label}`, () => {
    beforeAll(async () => {
      s = await setup();
    }, 60_000);
    afterAll(async () => {
      if (!s) return;
      s.speedUp?.();
      for (const id of created) await s.provider.delete(ctx(), id).catch(() => undefined);
      await s.provider.close?.();
      await s.close?.();
    }, 60_000);

    it(
      'create answers the instance under a stable ID with the Proxy identity; get reads the same',
      async () => {
        const name = s.uniqueName('create');
        const req = s.request(name, { uid: `uid-${name}`, namespace: 'team-a' });
        const inst = await create(req);
        expect(inst).toMatchObject({ name, uid: req.uid, namespace: 'team-a' });
        expect(INSTANCE_STATES).toContain(inst.state);
        expect(inst.id).toContain(name);
        const got = await s.provider.get(ctx(), inst.id);
        expect(got).toMatchObject({ id: inst.id, name, uid: req.uid, namespace: 'team-a' });
        expect(INSTANCE_STATES).toContain(got.state);
        if (got.state === 'Running') expect(got.address).toBeTruthy();
        if (inst.createdAt && got.createdAt) expect(got.createdAt.getTime()).toBe(inst.createdAt.getTime());
      },
      timeout,
    );

    it(
      'create is idempotent by name: again, and concurrently, it is one instance',
      async () => {
        const name = s.uniqueName('idem');
        const first = await create(s.request(name));
        const again = await create(s.request(name));
        const both = await Promise.all([create(s.request(name)), create(s.request(name))]);
        expect([again.id, ...both.map((i) => i.id)]).toEqual([first.id, first.id, first.id]);
        expect((await listed(name)).map((i) => i.id)).toEqual([first.id]);
      },
      timeout,
    );

    it(
      'create with a name the backend cannot use is Permanent and creates nothing',
      async () => {
        await expectClass(s.provider.create(ctx(), s.request('-Not a name')), 'Permanent');
        expect(await listed('-Not a name')).toEqual([]);
      },
      timeout,
    );

    it(
      'create of a name another Proxy (UID) owns is Permanent and leaves that instance alone',
      async () => {
        const name = s.uniqueName('owned');
        const mine = await create(s.request(name, { uid: `uid-${name}` }));
        const err = await expectClass(create(s.request(name, { uid: `uid-other-${name}` })), 'Permanent');
        expect(err.message).toContain('does not belong to this Proxy');
        expect(await s.provider.get(ctx(), mine.id)).toMatchObject({ id: mine.id, uid: `uid-${name}` });
        expect((await listed(name)).map((i) => i.id)).toEqual([mine.id]);
      },
      timeout,
    );

    it(
      'get answers NotFound for a missing instance and Permanent for a malformed ID',
      async () => {
        await expectClass(s.provider.get(ctx(), s.missingID()), 'NotFound');
        await expectClass(s.provider.get(ctx(), s.malformedID), 'Permanent');
      },
      timeout,
    );

    it(
      'delete removes the instance and is idempotent; a malformed ID is Permanent',
      async () => {
        const inst = await create(s.request(s.uniqueName('delete')));
        await s.provider.delete(ctx(), inst.id);
        await expectClass(s.provider.get(ctx(), inst.id), 'NotFound');
        expect(await listed(inst.name)).toEqual([]);
        await s.provider.delete(ctx(), inst.id);
        await s.provider.delete(ctx(), s.missingID());
        await expectClass(s.provider.delete(ctx(), s.malformedID), 'Permanent');
      },
      timeout,
    );

    it(
      'listByTag lists every managed instance with the Proxy identity and installation read back',
      async () => {
        const a = s.uniqueName('list-a');
        const b = s.uniqueName('list-b');
        const ia = await create(
          s.request(a, { uid: `uid-${a}`, namespace: 'ns-a', installation: 'installation-a' }),
        );
        // Without an installation: what instances created before installations existed look like.
        const ib = await create(
          s.request(b, { uid: `uid-${b}`, namespace: 'ns-b', installation: undefined }),
        );
        const all = await s.provider.listByTag(ctx());
        expect(all.find((i) => i.name === a)).toMatchObject({
          id: ia.id,
          uid: `uid-${a}`,
          namespace: 'ns-a',
          installation: 'installation-a',
        });
        const listedB = all.find((i) => i.name === b);
        expect(listedB).toMatchObject({
          id: ib.id,
          uid: `uid-${b}`,
          namespace: 'ns-b',
        });
        expect(listedB?.installation).toBeUndefined();
        for (const i of all) expect(INSTANCE_STATES).toContain(i.state);
      },
      timeout,
    );

    it(
      'a create whose signal is already aborted is Transient and creates nothing',
      async () => {
        const name = s.uniqueName('aborted');
        await expectClass(s.provider.create(aborted(), s.request(name)), 'Transient');
        expect(await listed(name)).toEqual([]);
      },
      timeout,
    );

    it(
      'get, delete and listByTag with an already aborted signal are Transient and change nothing',
      async () => {
        const inst = await create(s.request(s.uniqueName('abort-ops')));
        await expectClass(s.provider.get(aborted(), inst.id), 'Transient');
        await expectClass(s.provider.delete(aborted(), inst.id), 'Transient');
        await expectClass(s.provider.listByTag(aborted()), 'Transient');
        expect(await s.provider.get(ctx(), inst.id)).toMatchObject({ id: inst.id, name: inst.name });
      },
      timeout,
    );

    // Only where the backend can be slowed down on purpose (fake, gcp's fake server): the case is
    // not registered elsewhere rather than reported as skipped; the already-aborted case above
    // covers every provider.
    if (opts.midCallAbort === true)
      it(
        'a call aborted midway returns promptly as a Transient error',
        async () => {
          s.slowDown!(5000);
          try {
            for (const call of [
              (c: CallContext) => s.provider.get(c, s.missingID()),
              (c: CallContext) => s.provider.create(c, s.request(s.uniqueName('midway'))),
              (c: CallContext) => s.provider.listByTag(c),
            ]) {
              const ac = new AbortController();
              const started = Date.now();
              const pending = call(callContext(ac.signal));
              setTimeout(() => ac.abort(new Error('caller gave up')), 20);
              await expectClass(pending, 'Transient');
              expect(Date.now() - started).toBeLessThan(2000);
            }
          } finally {
            s.speedUp!();
          }
        },
        timeout,
      );
  });
}
