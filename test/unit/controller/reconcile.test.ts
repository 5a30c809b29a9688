import { describe, expect, it } from 'vitest';
import {
  ANNOTATION_SKIP_CLEANUP,
  ANNOTATION_SPEC_HASH,
  FINALIZER,
  LABEL_CLOUD_INIT_SECRET,
  LABEL_CREDENTIALS_FOR,
} from '../../../src/api/constants.ts';
import { credentialsFromSecret } from '../../../src/api/credentials.ts';
import { ReconcileError } from '../../../src/controller/reconciler.ts';
import { instanceName } from '../../../src/provider/naming.ts';
import { RetryAfterError } from '../../../src/runtime/workqueue.ts';
import { condition, createHarness, type Harness, NS, untilQuiet } from '../../support/controller/harness.ts';

const b64 = (s: string) => Buffer.from(s).toString('base64');

// The whole table runs on both stores: same semantics, one contract.
describe.each(['memory', 'embedded'] as const)('on the %s store', (backend) => {
  const mk = (o: Parameters<typeof createHarness>[0] = {}) => createHarness({ backend, ...o });

  describe('reconciler: provisioning', () => {
    it('creates one instance under the deterministic name and goes Ready in one status write', async () => {
      const h = await mk();
      await h.seed('eu-1', { port: 8080 });
      const res = await h.reconcile('eu-1');
      expect(res.requeueAfter).toBeUndefined();
      const p = h.proxy('eu-1')!;
      expect(p.metadata.finalizers).toContain(FINALIZER);
      const hash = p.metadata.annotations?.[ANNOTATION_SPEC_HASH];
      expect(hash).toMatch(/^[0-9a-f]{64}$/);
      const name = instanceName(p.metadata.uid!, hash!);
      expect(p.status).toMatchObject({
        phase: 'Ready',
        providerID: h.fake.idOf(name),
        instanceName: name,
        port: 8080,
      });
      expect(p.status?.url).toBe(`http://${p.status?.address}:8080`);
      expect(condition(p, 'Provisioned')).toMatchObject({ status: 'True', reason: 'InstanceRunning' });
      expect(h.fake.created).toBe(1);
      expect(h.statusWrites()).toBe(1);
      // A second pass changes nothing.
      await h.reconcile('eu-1');
      expect(h.statusWrites()).toBe(1);
      expect(h.fake.created).toBe(1);
    });

    it('polls a pending instance as Provisioning, then records Ready', async () => {
      const h = await mk({ fake: { pendingGets: 2 } });
      await h.seed('eu-1');
      expect(await h.reconcile('eu-1')).toEqual({ requeueAfter: 10_000 });
      let p = h.proxy('eu-1')!;
      expect(p.status?.phase).toBe('Provisioning');
      expect(p.status?.providerID).toBeDefined();
      expect(p.status?.address).toBeUndefined();
      expect(condition(p, 'Provisioned')).toMatchObject({ status: 'False', reason: 'Provisioning' });
      expect(await h.reconcile('eu-1')).toEqual({ requeueAfter: 10_000 });
      h.fake.markRunning(p.status!.providerID!);
      expect(await h.reconcile('eu-1')).toEqual({});
      p = h.proxy('eu-1')!;
      expect(p.status?.phase).toBe('Ready');
      expect(h.fake.created).toBe(1);
      expect(h.statusWrites()).toBeLessThanOrEqual(4);
    });

    it('fails with ProviderNotConfigured and creates nothing', async () => {
      const h = await mk();
      await h.seed('eu-1', { provider: 'nope' });
      expect(await h.reconcile('eu-1')).toEqual({});
      const p = h.proxy('eu-1')!;
      expect(p.status?.phase).toBe('Failed');
      expect(condition(p, 'Provisioned')).toMatchObject({ status: 'False', reason: 'ProviderNotConfigured' });
      expect(p.status?.message).toContain('"nope"');
      expect(h.fake.calls.create).toBe(0);
    });

    it('serves an External proxy at its endpoint without a finalizer or instance', async () => {
      const h = await mk();
      await h.seed('ext', {
        type: 'External',
        provider: undefined,
        placement: undefined,
        endpoint: { host: '203.0.113.7', port: 8080 },
      });
      await h.reconcile('ext');
      const p = h.proxy('ext')!;
      expect(p.status).toMatchObject({
        phase: 'Ready',
        address: '203.0.113.7',
        port: 8080,
        url: 'http://203.0.113.7:8080',
      });
      expect(p.metadata.finalizers ?? []).not.toContain(FINALIZER);
      expect(h.fake.calls.create).toBe(0);
    });
  });

  describe('reconciler: cloud-init and credentials', () => {
    it('reads cloud-init from a labelled Secret; missing → CloudInitError, recovers when it appears', async () => {
      const h = await mk();
      await h.seed('eu-1', { cloudInit: { secretRef: { name: 'init', key: 'user-data' } } });
      // Unlabelled Secret reads as missing.
      await h.seedSecret({
        metadata: { name: 'init', namespace: NS },
        data: { 'user-data': b64('#cloud-config\n') },
      });
      const r1 = await h.attempt('eu-1');
      expect(r1.error).toBeInstanceOf(ReconcileError);
      let p = h.proxy('eu-1')!;
      expect(condition(p, 'Provisioned')).toMatchObject({ status: 'False', reason: 'CloudInitError' });
      expect(p.status?.message).toContain('"init"');
      expect(h.fake.calls.create).toBe(0);

      await h.store.secrets.delete({ namespace: NS, name: 'init' });
      await h.seedSecret({
        metadata: { name: 'init', namespace: NS, labels: { [LABEL_CLOUD_INIT_SECRET]: 'true' } },
        data: { 'user-data': b64('#cloud-config\npackages: [squid]\n') },
      });
      await h.reconcile('eu-1');
      p = h.proxy('eu-1')!;
      expect(p.status?.phase).toBe('Ready');
      const inst = h.fake.byName(p.status!.instanceName!)!;
      expect(inst.request.cloudInit).toBe('#cloud-config\npackages: [squid]\n');
    });

    it('rotating the cloud-init Secret content replaces the instance', async () => {
      const h = await mk();
      const secret = {
        metadata: { name: 'init', namespace: NS, labels: { [LABEL_CLOUD_INIT_SECRET]: 'true' } },
        data: { 'user-data': b64('v1') },
      };
      await h.seedSecret(secret);
      await h.seed('eu-1', { cloudInit: { secretRef: { name: 'init', key: 'user-data' } } });
      await h.reconcile('eu-1');
      const first = h.proxy('eu-1')!.status!.providerID!;
      await h.store.secrets.delete({ namespace: NS, name: 'init' });
      await h.seedSecret({ ...secret, data: { 'user-data': b64('v2') } });
      await untilQuiet(h, 'eu-1');
      const p = h.proxy('eu-1')!;
      expect(p.status?.providerID).not.toBe(first);
      expect(h.fake.instances.has(first)).toBe(false);
      expect(h.fake.instances.size).toBe(1);
      expect(h.fake.byName(p.status!.instanceName!)!.request.cloudInit).toBe('v2');
    });

    it('generates <proxy>-auth owned by the Proxy and configures the instance with it', async () => {
      const h = await mk();
      const seeded = await h.seed('eu-1');
      await h.reconcile('eu-1');
      const s = await h.store.secrets.read({ namespace: NS, name: 'eu-1-auth' });
      expect(s.metadata.labels?.[LABEL_CREDENTIALS_FOR]).toBe('eu-1');
      expect(s.metadata.ownerReferences?.[0]).toMatchObject({
        kind: 'Proxy',
        name: 'eu-1',
        uid: seeded.metadata.uid,
      });
      const creds = credentialsFromSecret(s)!;
      expect(creds.password.length).toBeGreaterThanOrEqual(24);
      const p = h.proxy('eu-1')!;
      expect(h.fake.byName(p.status!.instanceName!)!.request.credentials).toEqual(creds);
      expect(p.status?.url).not.toContain(creds.password);
    });

    it('replaces a <proxy>-auth Secret left behind by an earlier Proxy of the same name', async () => {
      const h = await mk();
      await h.seedSecret({
        metadata: {
          name: 'eu-1-auth',
          namespace: NS,
          labels: { [LABEL_CREDENTIALS_FOR]: 'eu-1' },
          ownerReferences: [
            {
              apiVersion: 'crawl.example.com/v1alpha1',
              kind: 'Proxy',
              name: 'eu-1',
              uid: 'old-uid',
              controller: true,
            },
          ],
        },
        data: { username: b64('old'), password: b64('old-password') },
      });
      const seeded = await h.seed('eu-1');
      await h.reconcile('eu-1');
      const s = await h.store.secrets.read({ namespace: NS, name: 'eu-1-auth' });
      expect(s.metadata.ownerReferences?.[0]?.uid).toBe(seeded.metadata.uid);
      expect(credentialsFromSecret(s)?.username).not.toBe('old');
    });

    it('uses credentialsSecretRef; a missing one is CredentialsError and nothing is created', async () => {
      const h = await mk();
      await h.seed('eu-1', { credentialsSecretRef: { name: 'mine' } });
      const r = await h.attempt('eu-1');
      expect(r.error).toBeInstanceOf(ReconcileError);
      expect(condition(h.proxy('eu-1'), 'Provisioned')).toMatchObject({ reason: 'CredentialsError' });
      expect(h.fake.calls.create).toBe(0);
      await h.seedSecret({
        metadata: { name: 'mine', namespace: NS },
        data: { username: b64('bob'), password: b64('s3cret-pass') },
      });
      await h.reconcile('eu-1');
      const p = h.proxy('eu-1')!;
      expect(p.status?.phase).toBe('Ready');
      expect(h.fake.byName(p.status!.instanceName!)!.request.credentials).toEqual({
        username: 'bob',
        password: 's3cret-pass',
      });
    });
  });

  describe('reconciler: replacement and lost instances', () => {
    it('replaces on a spec change without ever dropping the serving address', async () => {
      const h = await mk();
      await h.seed('eu-1');
      await h.reconcile('eu-1');
      const old = h.proxy('eu-1')!.status!;
      h.fake.pendingGets = 1;
      const cur = h.proxy('eu-1')!;
      await h.store.proxies.update({ ...cur, spec: { ...cur.spec, placement: { zone: 'z2' } } });

      expect(await h.reconcile('eu-1')).toEqual({ requeueAfter: 10_000 });
      let p = h.proxy('eu-1')!;
      expect(p.status).toMatchObject({
        phase: 'Replacing',
        providerID: old.providerID,
        address: old.address,
      });
      expect(h.fake.instances.size).toBe(2);

      // The new instance turns Running: switch, old ID moves to retiring, is deleted, then dropped.
      const fresh = [...h.fake.instances.values()].find((i) => i.id !== old.providerID)!;
      h.fake.markRunning(fresh.id);
      const res = await h.reconcile('eu-1');
      p = h.proxy('eu-1')!;
      expect(p.status).toMatchObject({ phase: 'Ready', providerID: fresh.id, address: fresh.address });
      expect(h.fake.instances.has(old.providerID!)).toBe(false);
      expect(p.status?.retiring ?? []).toEqual([old.providerID]);
      expect(res.requeueAfter).toBe(5_000);
      await h.reconcile('eu-1');
      expect(h.proxy('eu-1')!.status?.retiring).toBeUndefined();
      expect(h.fake.instances.size).toBe(1);
    });

    it('writes where the instance runs and follows it to a replacement; a lost one has none', async () => {
      const h = await mk();
      await h.seed('eu-1', { placement: { zone: 'z1' } });
      await h.reconcile('eu-1');
      expect(h.proxy('eu-1')!.status?.location).toEqual({ zone: 'z1' });
      const cur = h.proxy('eu-1')!;
      await h.store.proxies.update({ ...cur, spec: { ...cur.spec, placement: { zone: 'z2' } } });
      await h.reconcile('eu-1');
      let p = h.proxy('eu-1')!;
      expect(p.status).toMatchObject({ phase: 'Ready', location: { zone: 'z2' } });
      h.fake.setState(p.status!.providerID!, 'Terminated');
      await h.reconcile('eu-1');
      p = h.proxy('eu-1')!;
      expect(p.status?.phase).toBe('Provisioning');
      expect(p.status?.location).toBeUndefined();
      // A provider that knows no location for the new instance leaves none behind.
      const again = h.proxy('eu-1')!;
      await h.store.proxies.update({ ...again, spec: { ...again.spec, placement: undefined } });
      await untilQuiet(h, 'eu-1');
      p = h.proxy('eu-1')!;
      expect(p.status?.phase).toBe('Ready');
      expect(p.status?.location).toBeUndefined();
    });

    it('clears a dead instance holding the replacement name, then completes the replacement', async () => {
      const h = await mk();
      await h.seed('eu-1');
      await h.reconcile('eu-1');
      const old = h.proxy('eu-1')!.status!.providerID!;
      h.fake.pendingGets = 100;
      const cur = h.proxy('eu-1')!;
      await h.store.proxies.update({ ...cur, spec: { ...cur.spec, port: 3999 } });
      await h.reconcile('eu-1');
      const fresh = [...h.fake.instances.keys()].find((id) => id !== old)!;
      h.fake.setState(fresh, 'Terminated');
      h.fake.pendingGets = 0;
      await untilQuiet(h, 'eu-1');
      const p = h.proxy('eu-1')!;
      expect(p.status).toMatchObject({ phase: 'Ready', providerID: fresh, port: 3999 });
      expect([...h.fake.instances.keys()]).toEqual([fresh]);
      expect(h.fake.instances.get(fresh)!.state).toBe('Running');
    });

    it('recreates a lost instance and counts it', async () => {
      const h = await mk();
      await h.seed('eu-1');
      await h.reconcile('eu-1');
      const id = h.proxy('eu-1')!.status!.providerID!;
      h.fake.loseInstance(id);
      await h.reconcile('eu-1');
      expect(h.proxy('eu-1')!.status?.phase).toBe('Ready');
      expect(h.fake.instances.size).toBe(1);
      expect(h.fake.created).toBe(2);
      const metric = await h.registry.getSingleMetric('proxy_operator_instances_lost_total')!.get();
      expect(metric.values.find((v) => v.labels.provider === 'fake')?.value).toBe(1);
    });

    it('deletes a terminated instance, then recreates it', async () => {
      const h = await mk();
      await h.seed('eu-1');
      await h.reconcile('eu-1');
      const id = h.proxy('eu-1')!.status!.providerID!;
      h.fake.setState(id, 'Terminated');
      expect(await h.reconcile('eu-1')).toEqual({ requeueAfter: 10_000 });
      let p = h.proxy('eu-1')!;
      expect(p.status?.phase).toBe('Provisioning');
      expect(p.status?.address).toBeUndefined();
      expect(condition(p, 'Provisioned')).toMatchObject({ reason: 'InstanceLost' });
      await h.reconcile('eu-1');
      p = h.proxy('eu-1')!;
      expect(p.status?.phase).toBe('Ready');
      expect(h.fake.created).toBe(2);
    });
  });

  describe('reconciler: provider errors by class', () => {
    it('QuotaExceeded: condition and a fixed slow retry', async () => {
      const h = await mk();
      await h.seed('eu-1');
      h.fake.fail('create', { errorClass: 'QuotaExceeded', message: 'quota CPUS exceeded' });
      const { error } = await h.attempt('eu-1');
      expect(error).toBeInstanceOf(RetryAfterError);
      expect((error as RetryAfterError).retryAfterMs).toBe(300_000);
      const p = h.proxy('eu-1')!;
      expect(condition(p, 'Provisioned')).toMatchObject({
        status: 'False',
        reason: 'QuotaExceeded',
        message: 'quota CPUS exceeded',
      });
      expect(p.status?.phase).toBe('Pending');
    });

    it('Permanent: Failed with the message, no retry until the generation changes', async () => {
      const h = await mk();
      await h.seed('eu-1');
      h.fake.fail('create', { errorClass: 'Permanent', message: 'machine type "small" does not exist' });
      expect(await h.reconcile('eu-1')).toEqual({});
      let p = h.proxy('eu-1')!;
      expect(p.status).toMatchObject({ phase: 'Failed', message: 'machine type "small" does not exist' });
      const calls = h.fake.calls.create;
      expect(await h.reconcile('eu-1')).toEqual({});
      expect(h.fake.calls.create).toBe(calls);
      h.fake.clearFaults();
      await h.store.proxies.update({
        ...p,
        spec: { ...p.spec, placement: { zone: 'z1', machineType: 'e2-micro' } },
      });
      await h.reconcile('eu-1');
      p = h.proxy('eu-1')!;
      expect(p.status?.phase).toBe('Ready');
    });

    it('Transient: retried with backoff; a Ready status is left alone', async () => {
      const h = await mk();
      await h.seed('eu-1');
      await h.reconcile('eu-1');
      const before = h.proxy('eu-1')!.status;
      const writes = h.statusWrites();
      h.fake.fail('get', { errorClass: 'Transient', message: 'connection reset' });
      const { error } = await h.attempt('eu-1');
      expect(error).toBeInstanceOf(ReconcileError);
      expect(error).not.toBeInstanceOf(RetryAfterError);
      expect(h.proxy('eu-1')!.status).toEqual(before);
      expect(h.statusWrites()).toBe(writes);
    });

    it('Transient before Ready: Provisioned=False ProviderError, and an unclassified error counts as transient', async () => {
      const h = await mk();
      await h.seed('eu-1');
      h.fake.fail('create', () => new Error('socket hang up'));
      const { error } = await h.attempt('eu-1');
      expect(error).toBeInstanceOf(ReconcileError);
      expect(condition(h.proxy('eu-1'), 'Provisioned')).toMatchObject({
        reason: 'ProviderError',
        message: 'socket hang up',
      });
      h.fake.clearFaults();
      await h.reconcile('eu-1');
      expect(h.proxy('eu-1')!.status?.phase).toBe('Ready');
    });

    it('a crash between create and the status write re-finds the same instance', async () => {
      const h = await mk();
      await h.seed('eu-1');
      h.fake.failAfter('create', { errorClass: 'Transient', count: 1 });
      expect((await h.attempt('eu-1')).error).toBeDefined();
      expect(h.proxy('eu-1')!.status?.providerID).toBeUndefined();
      await h.reconcile('eu-1');
      expect(h.fake.created).toBe(1);
      expect(h.proxy('eu-1')!.status?.providerID).toBe([...h.fake.instances.keys()][0]);
    });
  });

  describe('reconciler: deletion', () => {
    async function readyThenDelete(h: Harness, name = 'eu-1', annotations?: Record<string, string>) {
      await h.seed(name, {}, annotations ? { annotations } : {});
      await h.reconcile(name);
      const id = h.proxy(name)!.status!.providerID!;
      await h.store.proxies.delete({ namespace: NS, name });
      h.fake.calls.get = 0;
      h.fake.calls.delete = 0;
      return id;
    }

    it('no providerID: drops the finalizer without asking the provider', async () => {
      const h = await mk();
      await h.seed('eu-1', {}, { finalizers: [FINALIZER] });
      await h.store.proxies.delete({ namespace: NS, name: 'eu-1' });
      expect(await h.reconcile('eu-1')).toEqual({});
      expect(h.proxy('eu-1')).toBeUndefined();
      expect(h.fake.log).toEqual([]);
    });

    it('deletes the instance and polls until the provider says NotFound', async () => {
      const h = await mk();
      const id = await readyThenDelete(h);
      expect(await h.reconcile('eu-1')).toEqual({ requeueAfter: 5_000 });
      expect(h.proxy('eu-1')?.status?.phase).toBe('Deleting');
      expect(h.fake.calls.delete).toBe(1);
      expect(h.fake.instances.has(id)).toBe(false);
      expect(await h.reconcile('eu-1')).toEqual({});
      expect(h.proxy('eu-1')).toBeUndefined();
      // The generated credentials go with it.
      expect(h.store.secrets.get({ namespace: NS, name: 'eu-1-auth' })).toBeUndefined();
    });

    it('get NotFound: drops the finalizer', async () => {
      const h = await mk();
      const id = await readyThenDelete(h);
      h.fake.loseInstance(id);
      expect(await h.reconcile('eu-1')).toEqual({});
      expect(h.proxy('eu-1')).toBeUndefined();
      expect(h.fake.calls.delete).toBe(0);
    });

    it('permanent get still deletes and releases', async () => {
      const h = await mk();
      await readyThenDelete(h);
      h.fake.fail('get', { errorClass: 'Permanent', message: 'host retired' });
      expect(await h.reconcile('eu-1')).toEqual({});
      expect(h.proxy('eu-1')).toBeUndefined();
      expect(h.fake.calls.delete).toBe(1);
      expect(h.fake.instances.size).toBe(0);
    });

    it('a delete failure keeps the finalizer', async () => {
      const h = await mk();
      await readyThenDelete(h);
      h.fake
        .fail('get', { errorClass: 'Permanent' })
        .fail('delete', { errorClass: 'Permanent', message: 'denied' });
      const { error } = await h.attempt('eu-1');
      expect(error).toBeInstanceOf(ReconcileError);
      const p = h.proxy('eu-1')!;
      expect(p.metadata.finalizers).toContain(FINALIZER);
      expect(p.status?.phase).toBe('Deleting');
      expect(p.status?.message).toContain('denied');
      // Also with a normal get.
      h.fake.clearFaults('get');
      expect((await h.attempt('eu-1')).error).toBeDefined();
      expect(h.proxy('eu-1')!.metadata.finalizers).toContain(FINALIZER);
    });

    it('skip-cleanup abandons the instance without asking the provider', async () => {
      const h = await mk();
      const id = await readyThenDelete(h, 'eu-1', { [ANNOTATION_SKIP_CLEANUP]: 'true' });
      expect(await h.reconcile('eu-1')).toEqual({});
      expect(h.proxy('eu-1')).toBeUndefined();
      expect(h.fake.calls.get + h.fake.calls.delete).toBe(0);
      expect(h.fake.instances.has(id)).toBe(true);
    });

    it('skip-cleanup releases a proxy whose provider is gone', async () => {
      const h = await mk();
      await readyThenDelete(h, 'eu-1', { [ANNOTATION_SKIP_CLEANUP]: 'true' });
      h.providers.delete('fake');
      expect(await h.reconcile('eu-1')).toEqual({});
      expect(h.proxy('eu-1')).toBeUndefined();
    });

    it('provider gone without skip-cleanup: keeps retrying with an error naming the annotation', async () => {
      const h = await mk();
      await readyThenDelete(h);
      h.providers.delete('fake');
      const { error } = await h.attempt('eu-1');
      expect(String((error as Error).message)).toContain(ANNOTATION_SKIP_CLEANUP);
      expect(h.proxy('eu-1')!.metadata.finalizers).toContain(FINALIZER);
    });

    it('deletes every retiring ID too', async () => {
      const h = await mk();
      await h.seed('eu-1');
      await h.reconcile('eu-1');
      const extra = await h.fake.create(
        { signal: new AbortController().signal, log: undefined as never },
        {
          name: 'px-old',
          uid: 'u',
          namespace: NS,
          proxyName: 'eu-1',
          port: 3128,
          credentials: { username: 'a', password: 'b' },
        },
      );
      const p = h.proxy('eu-1')!;
      await h.store.proxies.patchStatus({ namespace: NS, name: 'eu-1' }, { retiring: [extra.id] });
      await h.store.proxies.delete({ namespace: NS, name: 'eu-1' });
      await untilQuiet(h, 'eu-1');
      expect(h.proxy('eu-1')).toBeUndefined();
      expect(h.fake.instances.size).toBe(0);
      expect(p.status?.providerID).toBeDefined();
    });
  });

  describe('reconciler: two status writers', () => {
    it("keeps the health engine's Healthy condition written between the reconciler's read and write", async () => {
      let interleave = false;
      const h = await mk({
        wrap: (s) => {
          const proxies = Object.create(s.proxies) as typeof s.proxies;
          proxies.read = async (key, opts) => {
            const obj = await s.proxies.read(key, opts);
            if (interleave) {
              interleave = false;
              // The health engine writes right after our read, with its own precondition.
              await s.proxies.patchStatus(
                key,
                {
                  conditions: [
                    ...(obj.status?.conditions ?? []),
                    {
                      type: 'Healthy',
                      status: 'True',
                      reason: 'ProbeSucceeded',
                      lastTransitionTime: new Date().toISOString(),
                    },
                  ],
                  health: { latencyMillis: 42 },
                },
                { resourceVersion: obj.metadata.resourceVersion! },
              );
            }
            return obj;
          };
          return { ...s, proxies };
        },
        fake: { pendingGets: 1 },
      });
      await h.seed('eu-1');
      await h.reconcile('eu-1'); // Provisioning
      h.fake.markRunning(h.proxy('eu-1')!.status!.providerID!);
      interleave = true;
      await h.reconcile('eu-1'); // read → health write → our write conflicts, re-reads, merges
      expect(interleave).toBe(false);
      const p = h.proxy('eu-1')!;
      expect(p.status?.phase).toBe('Ready');
      expect(condition(p, 'Healthy')).toMatchObject({ status: 'True', reason: 'ProbeSucceeded' });
      expect(condition(p, 'Provisioned')).toMatchObject({ status: 'True' });
      expect(p.status?.health).toEqual({ latencyMillis: 42 });
    });
  });

  describe('reconciler: unrecorded instances of an earlier spec', () => {
    it('retires a replacement that was still starting when the spec changed again', async () => {
      const h = await mk();
      await h.seed('eu-1');
      await h.reconcile('eu-1');
      const first = h.proxy('eu-1')!.status!.providerID!;
      h.fake.pendingGets = 100;
      let p = h.proxy('eu-1')!;
      await h.store.proxies.update({ ...p, spec: { ...p.spec, port: 3200 } });
      await h.reconcile('eu-1'); // creates the port-3200 instance, not yet running, not in status
      expect(h.proxy('eu-1')!.status?.phase).toBe('Replacing');
      const middle = [...h.fake.instances.keys()].find((id) => id !== first)!;
      h.fake.pendingGets = 0;
      p = h.proxy('eu-1')!;
      await h.store.proxies.update({ ...p, spec: { ...p.spec, port: 3300 } });
      await untilQuiet(h, 'eu-1');
      p = h.proxy('eu-1')!;
      expect(p.status?.phase).toBe('Ready');
      expect(p.status?.port).toBe(3300);
      expect([...h.fake.instances.keys()]).toEqual([p.status!.providerID]);
      expect(h.fake.instances.has(middle)).toBe(false);
      expect(h.fake.instances.has(first)).toBe(false);
    });
  });
});
