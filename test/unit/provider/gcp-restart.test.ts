/**
 * The gcp provider's `restart` (pool rotation `strategy: Restart`): a new ephemeral external IP
 * for the same VM by stop and start, through the real @google-cloud/compute client against the
 * fake GCE on loopback (test/support/fake-gce-power). Both operations are followed to their end
 * and never sent twice while GCE works on them; a failed one is GCE's code; a restart already
 * done (by this process, or per GCE's lastStopTimestamp after an operator restart) is not done
 * again; the registry says which providers can restart, and the decorators count the calls.
 */
import { googleAuthLibrary } from 'google-gax';
import { Registry } from 'prom-client';
import { describe, expect, it } from 'vitest';
import { silentLogger } from '../../../src/log/index.ts';
import { type CallContext, type CreateRequest, canRestart } from '../../../src/provider/contract.ts';
import { ProviderError } from '../../../src/provider/errors.ts';
import { createGcpProvider, type GcpProvider } from '../../../src/provider/gcp/index.ts';
import { createLocalProvider } from '../../../src/provider/local/index.ts';
import { providerRegistryFrom } from '../../../src/provider/registry.ts';
import { natIPOf } from '../../support/fake-gce-power.ts';
import { useFakeGce } from '../../support/gce-suite.ts';
import { freePortRange } from '../../support/ports.ts';
import { until } from '../../support/wait.ts';

const PROJECT = 'proj-restart-1';
const ZONE = 'europe-west1-b';
const NAME = 'px-0a1b2c3d11112222-9f8e7d6c5b';
const ID = `projects/${PROJECT}/zones/${ZONE}/instances/${NAME}`;
const KEY = `${PROJECT}/${ZONE}/${NAME}`;

const gce = useFakeGce({ zones: [ZONE], boot: true });
const { providers } = gce;
const ctx = (): CallContext => ({ signal: new AbortController().signal, log: silentLogger() });

function req(): CreateRequest {
  return {
    name: NAME,
    uid: '0a1b2c3d-1111-2222-3333-444455556666',
    namespace: 'crawl',
    proxyName: 'eu-1',
    zone: ZONE,
    port: 3128,
    credentials: { username: 'crawler', password: 'S3cret-pass-word-xyz' },
  };
}

function make(operationWaitMs = 5000, name = 'gcp-restart'): GcpProvider {
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

const posts = (action: 'stop' | 'start') =>
  gce.fake.requests.filter((r) => r.method === 'POST' && r.path.endsWith(`/instances/${NAME}/${action}`));
const stored = () => gce.fake.instances.get(KEY) ?? {};

/** A running VM made by the provider itself (the fake boots it with a loopback natIP). */
async function running(p: GcpProvider): Promise<string> {
  await p.create(ctx(), req());
  const inst = await p.get(ctx(), ID);
  expect(inst.state).toBe('Running');
  gce.fake.requests.length = 0;
  return inst.address ?? '';
}

async function failure(p: Promise<unknown>): Promise<ProviderError> {
  const err = await p.then(
    () => new Error('expected a rejection, the call succeeded'),
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(ProviderError);
  return err as ProviderError;
}

describe('gcp restart', () => {
  it('stops and starts the VM: same instance, a new external IP; asked again, nothing more happens', async () => {
    const p = make();
    const before = await running(p);
    const since = new Date();
    const inst = await p.restart(ctx(), ID, since);
    expect(inst).toMatchObject({ id: ID, name: NAME, state: 'Running' });
    expect(inst.address).toBeDefined();
    expect(inst.address).not.toBe(before);
    expect(inst.address).toBe(natIPOf(stored()));
    expect(stored().lastStopTimestamp).toBeDefined();
    expect(posts('stop')).toHaveLength(1);
    expect(posts('start')).toHaveLength(1);
    // The same restart asked again (a lost status write): done already, no second stop.
    expect(await p.restart(ctx(), ID, since)).toMatchObject({ state: 'Running', address: inst.address });
    expect(posts('stop')).toHaveLength(1);
    expect(posts('start')).toHaveLength(1);
  });

  it('follows slow operations across calls without sending them twice', async () => {
    const p = make(30);
    const before = await running(p);
    gce.fake.operationDelayMs = 300;
    const since = new Date();
    const first = await p.restart(ctx(), ID, since);
    expect(first.state).toBe('Stopping');
    const seen = new Set<string>([first.state]);
    const done = await until(
      'the restart to finish',
      async () => {
        const inst = await p.restart(ctx(), ID, since);
        seen.add(inst.state);
        return inst.state === 'Running' ? inst : undefined;
      },
      { timeoutMs: 5000, intervalMs: 20 },
    );
    expect(done.address).not.toBe(before);
    expect(seen.has('Terminated') || seen.has('Pending')).toBe(true);
    expect(posts('stop')).toHaveLength(1);
    expect(posts('start')).toHaveLength(1);
  });

  it('a start that fails is GCE code once; the next call starts again', async () => {
    const p = make();
    await running(p);
    gce.fake.failOperation({ type: 'start', code: 'ZONE_RESOURCE_POOL_EXHAUSTED', message: 'no capacity' });
    const since = new Date();
    const err = await failure(p.restart(ctx(), ID, since));
    expect(err.errorClass).toBe('QuotaExceeded');
    expect(err.message).toContain('ZONE_RESOURCE_POOL_EXHAUSTED: no capacity');
    expect(err.op).toBe('restart');
    expect(err.providerID).toBe(ID);
    expect(stored().status).toBe('TERMINATED');
    const inst = await p.restart(ctx(), ID, since);
    expect(inst.state).toBe('Running');
    expect(posts('stop')).toHaveLength(1);
    expect(posts('start')).toHaveLength(2);
  });

  it('after an operator restart, a VM GCE stopped since the restart began is not stopped again', async () => {
    const first = make(5000, 'gcp-a');
    await running(first);
    const since = new Date(Date.now() - 1000);
    await first.restart(ctx(), ID, since);
    gce.fake.requests.length = 0;
    // A new process: no memory of the operations, GCE's lastStopTimestamp tells.
    const second = make(5000, 'gcp-b');
    expect((await second.restart(ctx(), ID, since)).state).toBe('Running');
    expect(posts('stop')).toHaveLength(0);
    // A later restart is another one: stopped again.
    const later = new Date(Date.parse(String(stored().lastStopTimestamp)) + 1000);
    expect((await second.restart(ctx(), ID, later)).state).toBe('Running');
    expect(posts('stop')).toHaveLength(1);
  });

  it('a stopped VM is started; a missing one is NotFound', async () => {
    const p = make();
    await running(p);
    gce.fake.setStatus(PROJECT, ZONE, NAME, 'TERMINATED');
    expect((await p.restart(ctx(), ID, new Date())).state).toBe('Running');
    expect(posts('stop')).toHaveLength(0);
    gce.fake.instances.clear();
    const err = await failure(p.restart(ctx(), ID, new Date()));
    expect(err.errorClass).toBe('NotFound');
  });

  it('the registry says which providers can restart; the decorated call is counted as op restart', async () => {
    const gcp = make();
    await running(gcp);
    const local = createLocalProvider({ name: 'dev', config: { portRange: await freePortRange(1) } });
    expect(canRestart(gcp)).toBe(true);
    expect(canRestart(local)).toBe(false);
    const registry = new Registry();
    const reg = providerRegistryFrom([gcp, local], { registry });
    try {
      expect(reg.canRestart('gcp-restart')).toBe(true);
      expect(reg.canRestart('dev')).toBe(false);
      expect(reg.canRestart('nope')).toBeUndefined();
      expect(reg.get('dev')?.restart).toBeUndefined();
      const decorated = reg.get('gcp-restart');
      expect((await decorated?.restart?.(ctx(), ID, new Date()))?.state).toBe('Running');
      const text = await registry.metrics();
      expect(text).toMatch(/proxy_operator_provider_requests_total\{[^}]*op="restart",result="ok"\} 1/);
    } finally {
      await local.close();
    }
  });
});
