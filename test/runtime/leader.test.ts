/**
 * Lease leader election against the Kubernetes REST test server, over real client-node:
 * exactly one leader, takeover after a silent leader's lease expires (and not before), instant
 * hand-over on graceful stop, renew faults shorter than renewDeadline survived, longer ones
 * step the leader down. Short timings: lease 1.5 s (written as 2 s), renew 1 s, retry 0.2 s.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { sleep } from '../../src/runtime/clock.ts';
import { createKubeClients, type KubeClients } from '../../src/runtime/kube/client.ts';
import { LeaderElectionLost, StandaloneElector } from '../../src/runtime/leader/elector.ts';
import { LeaseElector, validateLeaseTimings } from '../../src/runtime/leader/lease.ts';
import { Manager } from '../../src/runtime/manager.ts';
import { type KubeServer, startKubeServer } from '../support/kube-server/index.ts';

const TIMINGS = { leaseDurationMs: 1500, renewDeadlineMs: 1000, retryPeriodMs: 200 };
const LEASE = { namespace: 'operators', name: 'egress-proxies-operator' };

let server: KubeServer;
const clients: KubeClients[] = [];
const cleanups: Array<() => Promise<void> | void> = [];

async function elector(identity: string): Promise<LeaseElector> {
  if (!server) server = await startKubeServer();
  const c = await createKubeClients(server.kubeConfig());
  clients.push(c);
  return new LeaseElector({ api: c.coordination, ...LEASE, identity, ...TIMINGS });
}

interface Campaign {
  e: LeaseElector;
  ac: AbortController;
  log: string[];
  done: Promise<void>;
  startedAt?: number;
}

function campaign(e: LeaseElector): Campaign {
  const ac = new AbortController();
  const c: Campaign = { e, ac, log: [], done: Promise.resolve() };
  c.done = e.run(ac.signal, {
    onStartedLeading: () => {
      c.startedAt = Date.now();
      c.log.push('started');
    },
    onStoppedLeading: () => c.log.push('stopped'),
    onNewLeader: (id) => c.log.push(`leader:${id}`),
  });
  cleanups.push(async () => {
    ac.abort();
    await c.done;
  });
  return c;
}

function lease() {
  return server.resource('leases').read(LEASE.namespace, LEASE.name) as unknown as {
    spec: {
      holderIdentity?: string;
      leaseTransitions?: number;
      renewTime?: string;
      leaseDurationSeconds?: number;
    };
  };
}

async function until(cond: () => boolean, ms = 5000): Promise<number> {
  const t0 = Date.now();
  while (!cond()) {
    if (Date.now() - t0 > ms) throw new Error('condition not met in time');
    await sleep(10);
  }
  return Date.now() - t0;
}

afterEach(async () => {
  for (const f of cleanups.splice(0).reverse()) await f();
  for (const c of clients.splice(0)) await c.close();
  await server?.stop();
  server = undefined as unknown as KubeServer;
});

describe('LeaseElector', () => {
  it('elects exactly one of two candidates and writes MicroTime renew times', async () => {
    const a = campaign(await elector('a'));
    const b = campaign(await elector('b'));
    await until(() => a.e.isLeader() || b.e.isLeader());
    for (let i = 0; i < 15; i++) {
      expect(a.e.isLeader() && b.e.isLeader()).toBe(false);
      expect(a.e.isLeader() || b.e.isLeader()).toBe(true);
      await sleep(50);
    }
    const leader = a.e.isLeader() ? 'a' : 'b';
    const spec = lease().spec;
    expect(spec.holderIdentity).toBe(leader);
    expect(spec.leaseTransitions).toBe(0);
    expect(spec.leaseDurationSeconds).toBe(2);
    expect(spec.renewTime).toMatch(/\.\d{6}Z$/);
    const before = spec.renewTime;
    await sleep(500);
    expect(lease().spec.renewTime).not.toBe(before); // renewing every retryPeriod
    const follower = leader === 'a' ? b : a;
    expect(follower.log).toContain(`leader:${leader}`);
  });

  it('a silent leader is replaced after its lease expires, not before', async () => {
    const a = campaign(await elector('a'));
    await until(() => a.e.isLeader());
    const b = campaign(await elector('b'));
    await sleep(600); // b has observed a's renewals
    expect(b.e.isLeader()).toBe(false);
    a.ac.abort(); // a stops renewing without releasing (as if it hung or was killed)
    const silentAt = Date.now();
    await until(() => b.e.isLeader(), 6000);
    const takeover = b.startedAt! - silentAt;
    // The 2 s lease counts from when b saw the last renewal: never early, soon after expiry.
    expect(takeover).toBeGreaterThanOrEqual(1200);
    expect(takeover).toBeLessThan(2000 + 2.2 * 200 + 1500);
    expect(lease().spec.holderIdentity).toBe('b');
    expect(lease().spec.leaseTransitions).toBe(1);
  });

  it('judges expiry by its own clock since the record last changed, never by renewTime', async () => {
    if (!server) server = await startKubeServer();
    const leases = server.resource('leases');
    // A live holder whose clock is decades behind ours: its renewTime always looks expired.
    const skewed = (ms: number) => `2000-01-01T00:00:${String(ms % 60).padStart(2, '0')}.000000Z`;
    leases.create({
      apiVersion: 'coordination.k8s.io/v1',
      kind: 'Lease',
      metadata: { name: LEASE.name, namespace: LEASE.namespace },
      spec: { holderIdentity: 'skewed', leaseDurationSeconds: 2, renewTime: skewed(0), leaseTransitions: 0 },
    } as never);
    let n = 0;
    const renewer = setInterval(() => {
      const cur = leases.read(LEASE.namespace, LEASE.name);
      leases.update({ ...cur, spec: { ...(cur.spec as object), renewTime: skewed(++n) } } as never);
    }, 200);
    cleanups.push(() => clearInterval(renewer));
    const b = campaign(await elector('b'));
    await sleep(2500);
    expect(b.e.isLeader()).toBe(false); // the holder keeps renewing: its lease is alive
    clearInterval(renewer);
    const silentAt = Date.now();
    await until(() => b.e.isLeader(), 5000);
    expect(b.startedAt! - silentAt).toBeGreaterThanOrEqual(1500);
    expect(lease().spec.leaseTransitions).toBe(1);
  });

  it('release hands over at once, well under the lease duration', async () => {
    const a = campaign(await elector('a'));
    await until(() => a.e.isLeader());
    const b = campaign(await elector('b'));
    await sleep(300);
    const t0 = Date.now();
    await a.e.release();
    expect(a.log).toContain('stopped');
    expect(a.e.isLeader()).toBe(false);
    // Released: no holder, a 1 s duration, so the next candidate need not wait for expiry.
    expect(lease().spec.holderIdentity ?? '').toBe('');
    expect(lease().spec.leaseDurationSeconds).toBe(1);
    await until(() => b.e.isLeader(), 3000);
    expect(Date.now() - t0).toBeLessThan(1900); // expiry would take >= 2 s
    expect(lease().spec.leaseTransitions).toBe(1);
    expect(lease().spec.holderIdentity).toBe('b');
  });

  it('survives renew failures shorter than renewDeadline', async () => {
    const a = campaign(await elector('a'));
    await until(() => a.e.isLeader());
    const fault = server.injectFault({ path: /\/leases\//, status: 500, times: 3 });
    await until(() => fault.hits >= 3, 3000);
    await sleep(500);
    expect(a.e.isLeader()).toBe(true);
    expect(a.log).not.toContain('stopped');
    expect(lease().spec.leaseTransitions).toBe(0);
  });

  it('steps down when it cannot renew within renewDeadline', async () => {
    const a = campaign(await elector('a'));
    await until(() => a.e.isLeader());
    server.injectFault({ path: /\/leases\//, status: 500, times: Number.POSITIVE_INFINITY });
    const took = await until(() => a.log.includes('stopped'), 4000);
    expect(took).toBeLessThan(1000 + 200 + 1000);
    expect(a.e.isLeader()).toBe(false);
    await a.done; // run() ends after losing
  });

  it('rejects inconsistent timings naming the field', () => {
    expect(() =>
      validateLeaseTimings({ leaseDurationMs: 10, renewDeadlineMs: 10, retryPeriodMs: 1, jitterFactor: 1.2 }),
    ).toThrow(/leaseDurationMs must be greater than renewDeadlineMs/);
    expect(() =>
      validateLeaseTimings({ leaseDurationMs: 15, renewDeadlineMs: 10, retryPeriodMs: 9, jitterFactor: 1.2 }),
    ).toThrow(/renewDeadlineMs/);
    expect(() =>
      validateLeaseTimings({ leaseDurationMs: 15, renewDeadlineMs: 10, retryPeriodMs: 0, jitterFactor: 1.2 }),
    ).toThrow(/retryPeriodMs/);
  });
});

describe('Manager with Lease election', () => {
  it('runs leader-only work on one replica; graceful stop hands over to the other at once', async () => {
    const running = new Map<string, number>();
    const overlap: string[] = [];
    const mk = async (id: string) => {
      const m = new Manager({ elector: await elector(id), gracePeriodMs: 2000 });
      m.add({
        name: 'gc',
        needLeaderElection: true,
        start: async (signal) => {
          running.set(id, Date.now());
          if (running.size > 1) overlap.push(id);
          await new Promise<void>((r) => signal.addEventListener('abort', () => r(), { once: true }));
          await sleep(50); // drain
          running.delete(id);
        },
      });
      const done = m.start();
      cleanups.push(async () => {
        await m.stop();
        await done.catch(() => {});
      });
      return { m, done };
    };
    const one = await mk('one');
    const two = await mk('two');
    await until(() => running.size === 1);
    await sleep(400);
    expect(running.size).toBe(1);
    const [first] = [...running.keys()];
    const [leader, other] = first === 'one' ? [one, two] : [two, one];
    const t0 = Date.now();
    await leader.m.stop();
    await leader.done;
    await until(() => other.m.isLeader(), 3000);
    expect(Date.now() - t0).toBeLessThan(1900); // expiry would take >= 2 s
    await until(() => running.size === 1);
    expect(overlap).toEqual([]);
  });

  it('exits with LeaderElectionLost when renewals keep failing', async () => {
    const m = new Manager({ elector: await elector('solo'), gracePeriodMs: 500 });
    const stopped: string[] = [];
    m.add({
      name: 'gc',
      needLeaderElection: true,
      start: async (signal) => {
        await new Promise<void>((r) => signal.addEventListener('abort', () => r(), { once: true }));
        stopped.push('gc');
      },
    });
    const done = m.start();
    await until(() => m.isLeader());
    server.injectFault({ path: /\/leases\//, status: 500, times: Number.POSITIVE_INFINITY });
    await expect(done).rejects.toBeInstanceOf(LeaderElectionLost);
    expect(stopped).toEqual(['gc']);
  });

  it('StandaloneElector leads at once and stops leading on release', async () => {
    const e = new StandaloneElector();
    const log: string[] = [];
    const ac = new AbortController();
    const run = e.run(ac.signal, {
      onStartedLeading: () => log.push('started'),
      onStoppedLeading: () => log.push('stopped'),
    });
    expect(e.isLeader()).toBe(true);
    await e.release();
    await run;
    expect(log).toEqual(['started', 'stopped']);
  });
});
