/**
 * Lease leader election against the Kubernetes REST test server, over real client-node, on a
 * fake clock: exactly one leader, takeover after a silent leader's lease expires (and not
 * before), instant hand-over on graceful stop, renew faults shorter than renewDeadline
 * survived, longer ones step the leader down, and a step of the wall clock changes no deadline
 * (they run on monotonic time). Time moves only when the test advances it, in
 * 10 ms steps after every in-flight Lease request has finished, so the bounds asserted are the
 * algorithm's, not the machine's load. Timings: lease 1.5 s (written as 2 s), renew 1 s,
 * retry 0.2 s; jitter from a seeded generator.
 */
import type { CoordinationV1Api } from '@kubernetes/client-node';
import { afterEach, describe, expect, it } from 'vitest';
import { createKubeClients, type KubeClients } from '../../../src/runtime/kube/client.ts';
import { LeaderElectionLost, StandaloneElector } from '../../../src/runtime/leader/elector.ts';
import { LeaseElector, validateLeaseTimings } from '../../../src/runtime/leader/lease.ts';
import { Manager } from '../../../src/runtime/manager.ts';
import { FakeClock } from '../../support/clock.ts';
import { type KubeServer, startKubeServer } from '../../support/kube-server/index.ts';
import { seededRandom } from '../../support/random.ts';
import { until } from '../../support/wait.ts';

const TIMINGS = { leaseDurationMs: 1500, renewDeadlineMs: 1000, retryPeriodMs: 200 };
/** The duration as written (whole seconds) and the longest jittered retry wait (× 2.2). */
const WRITTEN_LEASE_MS = 2000;
const MAX_RETRY_WAIT_MS = 200 * 2.2;
const STEP_MS = 10;
const LEASE = { namespace: 'operators', name: 'egress-proxies-operator' };

let server: KubeServer;
let clock: FakeClock;
let inflight = 0;
const random = seededRandom();
const clients: KubeClients[] = [];
const cleanups: Array<() => Promise<void> | void> = [];

/** The API with every call counted while in flight, so the test knows when the electors are idle. */
function tracked(api: CoordinationV1Api): CoordinationV1Api {
  return new Proxy(api, {
    get(target, prop, receiver) {
      const v = Reflect.get(target, prop, receiver) as unknown;
      if (typeof v !== 'function') return v;
      return (...args: unknown[]) => {
        inflight++;
        return (v as (...a: unknown[]) => Promise<unknown>).apply(target, args).finally(() => inflight--);
      };
    },
  });
}

async function elector(identity: string, advertise?: () => string | undefined): Promise<LeaseElector> {
  if (!server) server = await startKubeServer();
  clock ??= new FakeClock();
  const c = await createKubeClients(server.kubeConfig());
  clients.push(c);
  return new LeaseElector({
    api: tracked(c.coordination),
    ...LEASE,
    identity,
    ...TIMINGS,
    clock,
    random,
    ...(advertise ? { advertise } : {}),
  });
}

const macrotask = () => new Promise<void>((r) => setImmediate(r));

/** Waits until no Lease request is in flight and none starts on the next turn either. */
async function settle(): Promise<void> {
  for (;;) {
    await macrotask();
    if (inflight === 0) {
      await macrotask();
      if (inflight === 0) return;
    }
    await until('Lease requests to finish', () => inflight === 0);
  }
}

/** Advances fake time in steps (running `each` after every step) until `cond`; returns the time taken. */
async function advanceUntil(cond: () => boolean, maxMs: number, each?: () => void): Promise<number> {
  const t0 = clock.monotonic();
  await settle();
  while (!cond()) {
    if (clock.monotonic() - t0 >= maxMs) throw new Error(`condition not met within ${maxMs} ms of fake time`);
    clock.advance(STEP_MS);
    each?.();
    await settle();
  }
  return clock.monotonic() - t0;
}

/** Advances fake time by `ms`, checking `invariant` after every step. */
async function advance(ms: number, invariant?: () => void, each?: () => void): Promise<void> {
  const end = clock.monotonic() + ms;
  await settle();
  while (clock.monotonic() < end) {
    clock.advance(STEP_MS);
    each?.();
    await settle();
    invariant?.();
  }
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
      c.startedAt = clock.now();
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

afterEach(async () => {
  for (const f of cleanups.splice(0).reverse()) await f();
  for (const c of clients.splice(0)) await c.close();
  await server?.stop();
  server = undefined as unknown as KubeServer;
  clock = undefined as unknown as FakeClock;
});

describe('LeaseElector', () => {
  it('elects exactly one of two candidates and writes MicroTime renew times', async () => {
    const a = campaign(await elector('a'));
    const b = campaign(await elector('b'));
    await advanceUntil(() => a.e.isLeader() || b.e.isLeader(), 1000);
    await advance(3000, () => {
      expect(a.e.isLeader() && b.e.isLeader()).toBe(false);
      expect(a.e.isLeader() || b.e.isLeader()).toBe(true);
    });
    const leader = a.e.isLeader() ? 'a' : 'b';
    const spec = lease().spec;
    expect(spec.holderIdentity).toBe(leader);
    expect(spec.leaseTransitions).toBe(0);
    expect(spec.leaseDurationSeconds).toBe(2);
    expect(spec.renewTime).toMatch(/\.\d{6}Z$/);
    const before = spec.renewTime;
    await advance(TIMINGS.retryPeriodMs);
    expect(lease().spec.renewTime).not.toBe(before); // renewing every retryPeriod
    const follower = leader === 'a' ? b : a;
    expect(follower.log).toContain(`leader:${leader}`);
    expect(follower.log).not.toContain('started');
  });

  it('a silent leader is replaced after its lease expires, not before', async () => {
    const a = campaign(await elector('a'));
    await advanceUntil(() => a.e.isLeader(), 1000);
    const b = campaign(await elector('b'));
    await advance(600, () => expect(b.e.isLeader()).toBe(false)); // b observes a's renewals
    a.ac.abort(); // a stops renewing without releasing (as if it hung or was killed)
    await a.done;
    const silentAt = clock.now();
    await advanceUntil(() => b.e.isLeader(), 5000);
    const takeover = b.startedAt! - silentAt;
    // b times the 2 s lease from when it saw a's last renewal (at most one retry before a went
    // silent), and acquires at its first attempt after expiry.
    expect(takeover).toBeGreaterThanOrEqual(WRITTEN_LEASE_MS - TIMINGS.retryPeriodMs);
    expect(takeover).toBeLessThanOrEqual(WRITTEN_LEASE_MS + MAX_RETRY_WAIT_MS + STEP_MS);
    expect(lease().spec.holderIdentity).toBe('b');
    expect(lease().spec.leaseTransitions).toBe(1);
  });

  it('judges expiry by its own clock since the record last changed, never by renewTime', async () => {
    server = await startKubeServer();
    clock = new FakeClock();
    const leases = server.resource('leases');
    // A live holder whose clock is decades behind ours: its renewTime always looks expired.
    const skewed = (s: number) => `2000-01-01T00:00:${String(s % 60).padStart(2, '0')}.000000Z`;
    leases.create({
      apiVersion: 'coordination.k8s.io/v1',
      kind: 'Lease',
      metadata: { name: LEASE.name, namespace: LEASE.namespace },
      spec: { holderIdentity: 'skewed', leaseDurationSeconds: 2, renewTime: skewed(0), leaseTransitions: 0 },
    } as never);
    let n = 0;
    let renewing = true;
    const renewEvery200ms = () => {
      if (!renewing || clock.now() % 200 !== 0) return;
      const cur = leases.read(LEASE.namespace, LEASE.name);
      leases.update({ ...cur, spec: { ...(cur.spec as object), renewTime: skewed(++n) } } as never);
    };
    const b = campaign(await elector('b'));
    // The holder keeps renewing: its lease is alive however old renewTime looks.
    await advance(2500, () => expect(b.e.isLeader()).toBe(false), renewEvery200ms);
    renewing = false;
    const silentAt = clock.now();
    await advanceUntil(() => b.e.isLeader(), 5000);
    expect(b.startedAt! - silentAt).toBeGreaterThanOrEqual(WRITTEN_LEASE_MS - 200);
    expect(b.startedAt! - silentAt).toBeLessThanOrEqual(WRITTEN_LEASE_MS + MAX_RETRY_WAIT_MS + STEP_MS);
    expect(lease().spec.leaseTransitions).toBe(1);
  });

  it('release hands over at once, well under the lease duration', async () => {
    const a = campaign(await elector('a'));
    await advanceUntil(() => a.e.isLeader(), 1000);
    const b = campaign(await elector('b'));
    await advance(300);
    await a.e.release();
    expect(a.log).toContain('stopped');
    expect(a.e.isLeader()).toBe(false);
    // Released: no holder, a 1 s duration, so the next candidate need not wait for expiry.
    expect(lease().spec.holderIdentity ?? '').toBe('');
    expect(lease().spec.leaseDurationSeconds).toBe(1);
    // b takes it at its next attempt: within one jittered retry wait, not after an expiry.
    const took = await advanceUntil(() => b.e.isLeader(), 3000);
    expect(took).toBeLessThanOrEqual(MAX_RETRY_WAIT_MS + STEP_MS);
    expect(lease().spec.leaseTransitions).toBe(1);
    expect(lease().spec.holderIdentity).toBe('b');
  });

  it('publishes the leader discovery URL on the Lease; standbys know it only while the claim lives', async () => {
    let url: string | undefined;
    const a = campaign(await elector('a', () => url));
    await advanceUntil(() => a.e.isLeader(), 1000);
    const b = campaign(await elector('b', () => 'http://b.invalid:8090'));
    // Not listening yet: nothing published, so a standby knows no leader address.
    await advance(300);
    expect(b.e.leaderAddress()).toBeUndefined();
    url = 'http://10.1.2.3:8090';
    await advanceUntil(() => b.e.leaderAddress() === url, 1000);
    const annotations = (lease() as unknown as { metadata: { annotations?: Record<string, string> } })
      .metadata.annotations;
    expect(annotations?.['crawl.example.com/discovery-url']).toBe(url);
    expect(a.e.leaderAddress()).toBe(url);
    // A leader that goes silent stops being forwarded to once its claim has expired by b's clock.
    a.ac.abort();
    await a.done;
    await advanceUntil(() => b.e.leaderAddress() === undefined || b.e.isLeader(), 5000);
    await advanceUntil(() => b.e.isLeader(), 5000);
    expect(b.e.leaderAddress()).toBe('http://b.invalid:8090');
    // Release clears the published address with the holder.
    await b.e.release();
    const after = lease() as unknown as { metadata: { annotations?: Record<string, string> } };
    expect(after.metadata.annotations?.['crawl.example.com/discovery-url']).toBeUndefined();
  });

  it('survives renew failures shorter than renewDeadline', async () => {
    const a = campaign(await elector('a'));
    await advanceUntil(() => a.e.isLeader(), 1000);
    const fault = server.injectFault({ path: /\/leases\//, status: 500, times: 3 });
    await advanceUntil(() => fault.hits >= 3, 1000);
    await advance(500, () => expect(a.e.isLeader()).toBe(true));
    expect(a.log).not.toContain('stopped');
    expect(lease().spec.leaseTransitions).toBe(0);
  });

  it('steps down when it cannot renew within renewDeadline', async () => {
    const a = campaign(await elector('a'));
    await advanceUntil(() => a.e.isLeader(), 1000);
    server.injectFault({ path: /\/leases\//, status: 500, times: Number.POSITIVE_INFINITY });
    const took = await advanceUntil(() => a.log.includes('stopped'), 4000);
    // The last good renewal was at most one retry period before the fault.
    expect(took).toBeGreaterThanOrEqual(TIMINGS.renewDeadlineMs - TIMINGS.retryPeriodMs);
    expect(took).toBeLessThanOrEqual(TIMINGS.renewDeadlineMs + TIMINGS.retryPeriodMs);
    expect(a.e.isLeader()).toBe(false);
    await a.done; // run() ends after losing
  });

  it('a wall clock stepped back never extends leadership past renewDeadline', async () => {
    const a = campaign(await elector('a'));
    await advanceUntil(() => a.e.isLeader(), 1000);
    server.injectFault({ path: /\/leases\//, status: 500, times: Number.POSITIVE_INFINITY });
    await advance(TIMINGS.retryPeriodMs);
    clock.stepWall(-3_600_000); // an NTP correction an hour back while renewals fail
    const took = await advanceUntil(() => a.log.includes('stopped'), 4000);
    expect(took).toBeLessThanOrEqual(TIMINGS.renewDeadlineMs);
    expect(a.e.isLeader()).toBe(false);
  });

  it("a standby's wall clock stepped forward never cuts a live leader's claim short", async () => {
    const a = campaign(await elector('a'));
    await advanceUntil(() => a.e.isLeader(), 1000);
    const b = campaign(await elector('b'));
    await advance(300);
    clock.stepWall(3_600_000);
    await advance(3 * WRITTEN_LEASE_MS, () => {
      expect(b.e.isLeader()).toBe(false);
      expect(a.e.isLeader()).toBe(true);
    });
    expect(lease().spec.leaseTransitions).toBe(0);
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
          running.set(id, clock.now());
          if (running.size > 1) overlap.push(id);
          await new Promise<void>((r) => signal.addEventListener('abort', () => r(), { once: true }));
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
    await until('both managers to campaign', () => inflight > 0 || running.size > 0);
    await advanceUntil(() => running.size === 1, 1000);
    await advance(400, () => expect(running.size).toBe(1));
    const [first] = [...running.keys()];
    const [leader, other] = first === 'one' ? [one, two] : [two, one];
    await leader.m.stop();
    await leader.done;
    const took = await advanceUntil(() => other.m.isLeader() && running.size === 1, 3000);
    expect(took).toBeLessThanOrEqual(MAX_RETRY_WAIT_MS + STEP_MS); // expiry would take 2 s
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
    await until('the manager to campaign', () => inflight > 0 || m.isLeader());
    await advanceUntil(() => m.isLeader(), 1000);
    server.injectFault({ path: /\/leases\//, status: 500, times: Number.POSITIVE_INFINITY });
    let lost: unknown;
    done.catch((e: unknown) => {
      lost = e;
    });
    await advanceUntil(() => lost !== undefined, 3000);
    expect(lost).toBeInstanceOf(LeaderElectionLost);
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
