/**
 * The gcp provider follows Compute Engine's zone operations to their end, through the real
 * @google-cloud/compute client against the fake GCE on loopback: an insert or delete the API
 * accepted but whose operation fails later (capacity, quota, permissions) is a classified error
 * carrying GCE's code and message — never an instance that silently vanished and is inserted
 * again on the next poll — and a slow successful operation is waited for.
 */
import { googleAuthLibrary } from 'google-gax';
import { describe, expect, it } from 'vitest';
import { silentLogger } from '../../../src/log/index.ts';
import type { CallContext, CreateRequest } from '../../../src/provider/contract.ts';
import { ProviderError } from '../../../src/provider/errors.ts';
import { createGcpProvider, type GcpProvider } from '../../../src/provider/gcp/index.ts';
import { RetryAfterError } from '../../../src/runtime/workqueue.ts';
import { condition, createHarness } from '../../support/controller/harness.ts';
import { useFakeGce } from '../../support/gce-suite.ts';
import { until } from '../../support/wait.ts';

const PROJECT = 'proj-ops-1';
const ZONE = 'europe-west1-b';
const NAME = 'px-0a1b2c3d11112222-9f8e7d6c5b';
const ID = `projects/${PROJECT}/zones/${ZONE}/instances/${NAME}`;
const UID = '0a1b2c3d-1111-2222-3333-444455556666';
const EXHAUSTED =
  "The zone 'projects/proj-ops-1/zones/europe-west1-b' does not have enough resources available to fulfill the request.";

const gce = useFakeGce({ zones: [ZONE] });
const { providers } = gce;

const ctx = (): CallContext => ({ signal: new AbortController().signal, log: silentLogger() });

function req(extra: Partial<CreateRequest> = {}): CreateRequest {
  return {
    name: NAME,
    uid: UID,
    namespace: 'crawl',
    proxyName: 'eu-1',
    zone: ZONE,
    port: 3128,
    credentials: { username: 'crawler', password: 'S3cret-pass-word-xyz' },
    ...extra,
  };
}

function make(operationWaitMs: number, name = 'gcp-ops'): GcpProvider {
  const p = createGcpProvider({
    name,
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

async function failure(p: Promise<unknown>): Promise<ProviderError> {
  const err = await p.then(
    () => new Error('expected a rejection, the call succeeded'),
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(ProviderError);
  return err as ProviderError;
}

const inserts = () => gce.fake.requests.filter((r) => r.method === 'POST' && r.path.endsWith('/instances'));
const deletes = () => gce.fake.requests.filter((r) => r.method === 'DELETE');
const opsDone = () => [...gce.fake.operations.values()].every((o) => o.status === 'DONE');

describe('insert operations', () => {
  it('a slow successful insert is waited for, then read back', async () => {
    gce.fake.operationDelayMs = 400;
    const p = make(5000);
    const started = Date.now();
    const inst = await p.create(ctx(), req());
    expect(Date.now() - started).toBeGreaterThanOrEqual(350);
    expect(inst).toMatchObject({ id: ID, state: 'Pending', uid: UID });
    expect(opsDone()).toBe(true);
    expect(gce.fake.requests.some((r) => r.path.endsWith('/wait'))).toBe(true);
  });

  it('an insert failing within the wait is a QuotaExceeded carrying the code; the next create inserts again', async () => {
    gce.fake.failOperation({
      type: 'insert',
      code: 'ZONE_RESOURCE_POOL_EXHAUSTED',
      message: EXHAUSTED,
      afterMs: 100,
    });
    const p = make(5000);
    const err = await failure(p.create(ctx(), req()));
    expect(err.errorClass).toBe('QuotaExceeded');
    expect(err.message).toContain('ZONE_RESOURCE_POOL_EXHAUSTED');
    expect(err.message).toContain(EXHAUSTED);
    expect(err.providerID).toBe(ID);
    expect(gce.fake.instances.size).toBe(0);
    // The failure was reported: the caller's next create (after its backoff) is a new insert.
    await p.create(ctx(), req());
    expect(inserts()).toHaveLength(2);
    expect(gce.fake.instances.size).toBe(1);
  });

  it('an insert failing after the wait: get says Pending while it runs, then the error once, then NotFound naming it', async () => {
    gce.fake.failOperation({
      type: 'insert',
      code: 'ZONE_RESOURCE_POOL_EXHAUSTED',
      message: EXHAUSTED,
      afterMs: 700,
      instance: 'vanishes',
    });
    const p = make(50);
    expect(await p.create(ctx(), req())).toMatchObject({ id: ID, state: 'Pending' });
    // Still running: the instance is there (PROVISIONING) or, once gone, reported Pending.
    expect((await p.get(ctx(), ID)).state).toBe('Pending');
    await until('the insert operation to fail', opsDone, 3000);
    const err = await failure(p.get(ctx(), ID));
    expect(err.errorClass).toBe('QuotaExceeded');
    expect(err.message).toContain(`ZONE_RESOURCE_POOL_EXHAUSTED: ${EXHAUSTED}`);
    const after = await failure(p.get(ctx(), ID));
    expect(after.errorClass).toBe('NotFound');
    expect(after.message).toContain('insert failed');
    expect(inserts()).toHaveLength(1);
  });

  it('create of a name whose insert still runs polls the operation instead of inserting again', async () => {
    gce.fake.failOperation({
      type: 'insert',
      code: 'QUOTA_EXCEEDED',
      message: "Quota 'CPUS' exceeded.",
      afterMs: 600,
    });
    const p = make(50);
    expect((await p.create(ctx(), req())).state).toBe('Pending');
    expect((await p.create(ctx(), req())).state).toBe('Pending');
    await until('the insert operation to fail', opsDone, 3000);
    const err = await failure(p.create(ctx(), req()));
    expect(err.errorClass).toBe('QuotaExceeded');
    expect(err.message).toContain("QUOTA_EXCEEDED: Quota 'CPUS' exceeded.");
    expect(inserts()).toHaveLength(1);
  });

  it('a permission error in the operation is Permanent; an internal error Transient', async () => {
    const p = make(5000);
    gce.fake.failOperation({
      type: 'insert',
      code: 'PERMISSIONS_ERROR',
      message: "Required 'compute.disks.create' permission",
      httpStatus: 403,
    });
    const denied = await failure(p.create(ctx(), req()));
    expect(denied.errorClass).toBe('Permanent');
    expect(denied.message).toContain('PERMISSIONS_ERROR');
    gce.fake.failOperation({ type: 'insert', code: 'INTERNAL_ERROR', message: 'Internal error.' });
    expect((await failure(p.create(ctx(), req()))).errorClass).toBe('Transient');
  });

  it('through the reconciler: an async ZONE_RESOURCE_POOL_EXHAUSTED is a QuotaExceeded condition with the code, and no second insert within the backoff', async () => {
    const gcp = make(50, 'gcp-test');
    const h = await createHarness({ deps: { providers: new Map([['gcp-test', gcp]]) } });
    await h.seed('eu-1', { provider: 'gcp-test', placement: { zone: ZONE } });
    gce.fake.failOperation({
      type: 'insert',
      code: 'ZONE_RESOURCE_POOL_EXHAUSTED',
      message: EXHAUSTED,
      afterMs: 500,
      instance: 'vanishes',
    });
    // First pass: the insert is accepted and still running.
    expect((await h.reconcile('eu-1')).requeueAfter).toBe(10_000);
    await until('the insert operation to fail', opsDone, 3000);
    // The provision poll: the operation's error, a slow fixed retry.
    const { error } = await h.attempt('eu-1');
    expect(error).toBeInstanceOf(RetryAfterError);
    expect((error as RetryAfterError).retryAfterMs).toBe(300_000);
    expect(condition(h.proxy('eu-1'), 'Provisioned')).toMatchObject({
      status: 'False',
      reason: 'QuotaExceeded',
      message: expect.stringContaining(`ZONE_RESOURCE_POOL_EXHAUSTED: ${EXHAUSTED}`),
    });
    expect(inserts()).toHaveLength(1);
    // After the backoff the pass inserts again, and the capacity is back this time.
    expect((await h.attempt('eu-1')).error).toBeUndefined();
    expect(inserts()).toHaveLength(2);
    expect(gce.fake.instances.size).toBe(1);
    // A create that failed is not an instance lost behind the operator's back.
    const lost = await h.registry.getSingleMetric('proxy_operator_instances_lost_total')?.get();
    expect(lost?.values.reduce((n, v) => n + v.value, 0) ?? 0).toBe(0);
  });
});

describe('delete operations', () => {
  it('a failed delete operation is surfaced with its code and the instance stays', async () => {
    gce.fake.put(PROJECT, ZONE, NAME);
    gce.fake.failOperation({
      type: 'delete',
      code: 'RESOURCE_IN_USE_BY_ANOTHER_RESOURCE',
      message: `The instance '${NAME}' is in use.`,
      afterMs: 100,
    });
    const err = await failure(make(5000).delete(ctx(), ID));
    expect(err.errorClass).toBe('Transient');
    expect(err.message).toContain('RESOURCE_IN_USE_BY_ANOTHER_RESOURCE');
    expect(gce.fake.instances.size).toBe(1);
  });

  it('a delete still running is polled, not sent again; its later failure is reported once', async () => {
    gce.fake.put(PROJECT, ZONE, NAME);
    gce.fake.failOperation({
      type: 'delete',
      code: 'PERMISSIONS_ERROR',
      message: "Required 'compute.instances.delete' permission",
      httpStatus: 403,
      afterMs: 600,
    });
    const p = make(50);
    await p.delete(ctx(), ID);
    await p.delete(ctx(), ID);
    expect(deletes()).toHaveLength(1);
    await until('the delete operation to fail', opsDone, 3000);
    const err = await failure(p.delete(ctx(), ID));
    expect(err.errorClass).toBe('Permanent');
    expect(err.message).toContain("PERMISSIONS_ERROR: Required 'compute.instances.delete' permission");
    // Reported: the next delete asks again, and this time it goes through.
    await p.delete(ctx(), ID);
    expect(deletes()).toHaveLength(2);
    expect(gce.fake.instances.size).toBe(0);
  });

  it('a slow successful delete is waited for; one whose VM was already gone succeeded', async () => {
    gce.fake.put(PROJECT, ZONE, NAME);
    gce.fake.operationDelayMs = 400;
    const p = make(5000);
    await p.delete(ctx(), ID);
    expect(gce.fake.instances.size).toBe(0);
    gce.fake.put(PROJECT, ZONE, NAME);
    gce.fake.failOperation({ type: 'delete', code: 'RESOURCE_NOT_FOUND', message: 'gone', httpStatus: 404 });
    await p.delete(ctx(), ID);
  });
});
