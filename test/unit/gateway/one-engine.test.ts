/**
 * One selection engine: for the same fleet and the same connections, a cluster replica (fed by
 * the leader's hub) chooses exactly the upstreams standalone's LeaseStoreChooser chooses over
 * the store — selectors, cooldowns per site, least-used order, sticky sessions, capacity. Also:
 * a malformed sync answer is refused naming its field and changes nothing on the replica, and
 * the hub's change log stays incremental past its bound.
 */
import fc from 'fast-check';
import { afterEach, describe, expect, it } from 'vitest';
import { MAX_LOG } from '../../../src/gateway/hub.ts';
import { SyncInputError } from '../../../src/gateway/share.ts';
import { type Acquired, type AcquireOutcome, LeaseStoreChooser } from '../../../src/gateway/upstreams.ts';
import { DEFAULT_SESSION_TTL_SECONDS } from '../../../src/gateway/username.ts';
import { LeaseStore } from '../../../src/lease/store.ts';
import type { ProxyInfo } from '../../../src/lease/types.ts';
import { FakeClock } from '../../support/clock.ts';
import {
  acquire,
  type InProcessReplica,
  type Leader,
  newLeader,
  newReplica,
  sync,
} from '../../support/gateway/in-process.ts';
import { proxyInfo } from '../../support/lease.ts';
import { TEST_SEED } from '../../support/random.ts';

const closers: (() => void)[] = [];
afterEach(() => {
  for (const c of closers.splice(0)) c();
});

function fleet(): ProxyInfo[] {
  return [
    proxyInfo('p1', { maxLeases: 2, latencyMillis: 30, labels: { pool: 'a' } }),
    proxyInfo('p2', { maxLeases: 3, latencyMillis: 10, labels: { pool: 'a' } }),
    proxyInfo('p3', { maxLeases: 0, latencyMillis: 20, labels: { pool: 'b' } }),
    proxyInfo('p4', { maxLeases: 1, labels: { pool: 'b' } }),
    proxyInfo('p5', { maxLeases: 2, latencyMillis: 10, labels: { pool: 'a' } }),
  ];
}

async function cluster(clock: FakeClock): Promise<{ leader: Leader; replica: InProcessReplica }> {
  const leader = newLeader(clock, fleet());
  const replica = newReplica(clock, () => leader);
  closers.push(() => {
    leader.hub.close();
    leader.store.close();
    replica.chooser.close();
  });
  for (let i = 0; i < 3; i++) await sync(replica);
  expect(replica.chooser.ready).toBe(true);
  return { leader, replica };
}

const TARGETS = ['shop.example', 'news.example'];
const SELECTORS = [undefined, 'pool=a', 'pool=b'];
const SESSIONS = [undefined, undefined, 's1', 's2', 's3'];

type Op =
  | { op: 'open'; target: number; selector: number; session: number }
  | { op: 'close'; i: number }
  | { op: 'block'; i: number }
  | { op: 'fail'; i: number }
  | { op: 'wait'; ms: number };

const opArb: fc.Arbitrary<Op> = fc.oneof(
  {
    weight: 6,
    arbitrary: fc.record({
      op: fc.constant('open' as const),
      target: fc.nat(TARGETS.length - 1),
      selector: fc.nat(SELECTORS.length - 1),
      session: fc.nat(SESSIONS.length - 1),
    }),
  },
  { weight: 3, arbitrary: fc.record({ op: fc.constant('close' as const), i: fc.nat() }) },
  { weight: 1, arbitrary: fc.record({ op: fc.constant('block' as const), i: fc.nat() }) },
  { weight: 1, arbitrary: fc.record({ op: fc.constant('fail' as const), i: fc.nat() }) },
  {
    weight: 1,
    arbitrary: fc.record({ op: fc.constant('wait' as const), ms: fc.integer({ min: 1, max: 90_000 }) }),
  },
);

function chosen(o: AcquireOutcome): string {
  return o.ok ? o.acquired.upstream.key : `refused ${o.status}`;
}

describe('one selection engine', () => {
  it('a replica chooses what standalone chooses, connection by connection', async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(opArb, { minLength: 1, maxLength: 60 }), async (ops) => {
        const clock = new FakeClock();
        const store = new LeaseStore({ clock });
        for (const p of fleet()) store.upsertProxy(p);
        const standalone = new LeaseStoreChooser(store, clock);
        const { replica } = await cluster(clock);
        closers.push(() => store.close());
        const open: { s: Acquired; r: Acquired }[] = [];
        for (const op of ops) {
          if (op.op === 'open') {
            const routing = {
              sessionTtlSeconds: DEFAULT_SESSION_TTL_SECONDS,
              ...(SELECTORS[op.selector] ? { selector: SELECTORS[op.selector] } : {}),
              ...(SESSIONS[op.session] ? { session: SESSIONS[op.session] } : {}),
            };
            const target = TARGETS[op.target] as string;
            const s = standalone.acquire(target, routing);
            const r = await acquire(replica, clock, target, routing);
            expect(chosen(r), JSON.stringify(op)).toBe(chosen(s));
            if (s.ok && r.ok) open.push({ s: s.acquired, r: r.acquired });
          } else if (op.op === 'wait') {
            clock.advance(op.ms);
            for (const o of open) {
              expect(replica.chooser.renew(o.r.leaseId)).toBe(standalone.renew(o.s.leaseId));
            }
          } else if (open.length > 0) {
            const [o] = open.splice(op.i % open.length, 1) as [{ s: Acquired; r: Acquired }];
            if (op.op !== 'close') {
              standalone.report(o.s, op.op === 'block' ? 'blocked' : 'failed');
              replica.chooser.report(o.r, op.op === 'block' ? 'blocked' : 'failed');
            }
            standalone.release(o.s);
            replica.chooser.release(o.r);
          }
          // The replica's link syncs every few seconds; here after every step, so its share has
          // headroom again and the leader's cooldowns have arrived.
          await sync(replica);
          await sync(replica);
        }
      }),
      { seed: TEST_SEED, numRuns: 60 },
    );
  });

  it('a malformed sync answer is refused naming the field, and changes nothing', async () => {
    const clock = new FakeClock();
    const { leader, replica } = await cluster(clock);
    const { replica: twin } = await cluster(clock);
    const good = JSON.parse(
      JSON.stringify(await leader.hub.sync({ replica: 'other', epoch: '', cursor: 0, waitMs: 0, want: {} })),
    );
    // The blocked site and a wholly different fleet would both show if any of it were applied.
    good.cooldowns = [['crawl/p2', 'shop.example', 600_000]];
    good.upstreams = good.upstreams.map((u: { labels: object }) => ({ ...u, labels: { pool: 'z' } }));
    const bad: [string, (a: Record<string, unknown>) => void][] = [
      ['upstreams[1].maxLeases', (a) => ((a.upstreams as Record<string, unknown>[])[1]!.maxLeases = -1)],
      ['upstreams[0].reason', (a) => ((a.upstreams as Record<string, unknown>[])[0]!.reason = 'Sleepy')],
      [
        'upstreams[2].labels.pool',
        (a) => ((a.upstreams as Record<string, unknown>[])[2]!.labels = { pool: 7 }),
      ],
      ['cursor', (a) => (a.cursor = 'x')],
      ['full', (a) => delete a.full],
      ['cooldowns[0][2]', (a) => (a.cooldowns = [['crawl/p2', 'shop.example', '600']])],
      ['cooldowns[0][1]', (a) => (a.cooldowns = [['crawl/p2', 'shop example/x', 600_000]])],
      ['slots.crawl/p1[0].url', (a) => (a.slots = { 'crawl/p1': [{ id: 'x', url: 'not a url' }] })],
    ];
    const before = JSON.stringify(replica.chooser.shares());
    for (const [field, spoil] of bad) {
      const answer = structuredClone(good);
      spoil(answer);
      let err: unknown;
      try {
        replica.chooser.applyAnswer(answer);
      } catch (e) {
        err = e;
      }
      expect(err, field).toBeInstanceOf(SyncInputError);
      expect((err as SyncInputError).field, field).toBe(field);
      expect((err as SyncInputError).message).toContain(field);
    }
    expect(JSON.stringify(replica.chooser.shares())).toBe(before);
    // It chooses exactly as a replica that never saw them: same selectors, no block on p2.
    for (let i = 0; i < 4; i++) {
      const a = await acquire(replica, clock, 'shop.example', { selector: 'pool=a' });
      const b = await acquire(twin, clock, 'shop.example', { selector: 'pool=a' });
      expect(chosen(a)).toBe(chosen(b));
      expect(a.ok).toBe(true);
    }
    // A malformed answer through the link is a failed sync; the next good one applies.
    expect(await sync(replica)).toBe(true);
  });

  it("the hub's change log answers incrementally past its bound, and in full beyond it", async () => {
    const clock = new FakeClock();
    const { leader } = await cluster(clock);
    const first = await leader.hub.sync({ replica: 'r1', epoch: '', cursor: 0, waitMs: 0 });
    const report = (i: number) =>
      leader.store.reportProxy({
        namespace: 'crawl',
        name: 'p1',
        target: `t${i}.example`,
        result: 'blocked',
      });
    for (let i = 0; i < MAX_LOG + 10; i++) report(i);
    const behind = await leader.hub.sync({
      replica: 'r1',
      epoch: first.epoch,
      cursor: first.cursor,
      waitMs: 0,
    });
    expect(behind.full).toBe(true);
    for (let i = MAX_LOG + 10; i < MAX_LOG + 15; i++) report(i);
    const recent = await leader.hub.sync({
      replica: 'r1',
      epoch: first.epoch,
      cursor: behind.cursor,
      waitMs: 0,
    });
    expect(recent.full).toBe(false);
    expect(recent.cooldowns.map((c) => c[1])).toEqual(
      [0, 1, 2, 3, 4].map((i) => `t${MAX_LOG + 10 + i}.example`),
    );
    // The oldest change still in the ring is answered incrementally too.
    const oldest = await leader.hub.sync({
      replica: 'r1',
      epoch: first.epoch,
      cursor: recent.cursor - MAX_LOG,
      waitMs: 0,
    });
    expect(oldest.full).toBe(false);
    expect(oldest.cooldowns).toHaveLength(MAX_LOG);
    expect(oldest.cooldowns[0]?.[1]).toBe(`t${15}.example`);
  });
});
