/**
 * A model-based test (fast-check commands) of gateway scale-out in one process: a leader's hub
 * over a lease store, 2–4 replicas linked to it without sockets, connections opened and closed
 * through the replicas, API leases, blocks, the leader stepping down and a new leader taking
 * over from its lease state. After every command no proxy carries more than its maxLeases
 * (connections open on every replica plus API leases); once the replicas have synced, a block
 * reported through any replica keeps every replica off that upstream for that site. Leader gaps
 * stay below the slot lease TTL: a share outliving its leases is not what this claims.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { REPLICA_TIMEOUT_MS } from '../../../src/gateway/hub.ts';
import type { Acquired } from '../../../src/gateway/upstreams.ts';
import type { LeaseStore } from '../../../src/lease/store.ts';
import { DEFAULT_BLOCKED_COOLDOWN_SECONDS, type ProxyInfo } from '../../../src/lease/types.ts';
import { FakeClock } from '../../support/clock.ts';
import {
  acquire,
  type InProcessReplica,
  type Leader,
  newLeader,
  newReplica,
  stepDown,
  sync,
} from '../../support/gateway/in-process.ts';
import { proxyInfo } from '../../support/lease.ts';
import { TEST_SEED } from '../../support/random.ts';

const TARGETS = ['shop.example', 'news.example'];
/** The longest a replica's sync loop is modelled to be silent (it syncs every 2 s). */
const MAX_TICK_MS = 2000;
/** Leader gaps stay well below REPLICA_TIMEOUT_MS and the slot leases' TTL. */
const MAX_GAP_MS = REPLICA_TIMEOUT_MS / 2;

class World {
  readonly clock = new FakeClock();
  readonly fleet: ProxyInfo[];
  leader: Leader | undefined;
  state: ReturnType<LeaseStore['exportState']> | undefined;
  leaderlessSince = 0;
  readonly replicas: (InProcessReplica & { open: Acquired[] })[];
  readonly api: { id: string; key: string }[] = [];
  /** Blocks reported through a replica: [upstream, target, until]. */
  readonly blocks: [string, string, number][] = [];

  constructor(caps: number[], replicas: number) {
    this.fleet = caps.map((maxLeases, i) =>
      proxyInfo(`p${i}`, {
        maxLeases,
        latencyMillis: 10 + i,
        labels: { name: `p${i}`, pool: i % 2 ? 'b' : 'a' },
      }),
    );
    this.leader = newLeader(this.clock, this.fleet);
    this.replicas = Array.from({ length: replicas }, () => ({
      ...newReplica(this.clock, () => this.leader),
      open: [],
    }));
  }

  async start(): Promise<void> {
    for (let i = 0; i < 3; i++) for (const r of this.replicas) await sync(r);
  }

  close(): void {
    if (this.leader) stepDown(this.leader);
    for (const r of this.replicas) r.chooser.close();
  }

  /** The invariant: per limited proxy, connections on every replica plus API leases ≤ maxLeases. */
  checkCapacity(): void {
    const used = new Map<string, number>();
    let full = 0;
    const add = (key: string) => used.set(key, (used.get(key) ?? 0) + 1);
    for (const r of this.replicas) for (const a of r.open) add(a.upstream.key);
    for (const l of this.api) add(l.key);
    for (const p of this.fleet) {
      if (p.maxLeases === 0) continue;
      const n = used.get(p.key) ?? 0;
      if (n > p.maxLeases) throw new Error(`${p.key} carries ${n} > maxLeases ${p.maxLeases}`);
      if (n === p.maxLeases) full++;
    }
    if (full > 0) seen.atFullCapacity++;
  }

  async syncAll(): Promise<void> {
    for (const r of this.replicas) await sync(r);
  }
}

type Cmd = fc.AsyncCommand<object, World>;

/** What the runs exercised, so a generator that stopped reaching a case fails the test. */
const seen = { opened: 0, refused: 0, atFullCapacity: 0, blocksProbed: 0, takeOvers: 0 };

function cmd(name: string, run: (w: World) => Promise<void>, check: (w: World) => boolean = () => true): Cmd {
  return {
    check: () => true,
    async run(_m, w) {
      if (!check(w)) return;
      await run(w);
      w.checkCapacity();
    },
    toString: () => name,
  };
}

const replicaIdx = fc.nat(3);
const [open, close, block, apiLease, apiRelease, syncOne, tick, down, up, probe] = [
  fc
    .record({
      r: replicaIdx,
      t: fc.nat(TARGETS.length - 1),
      sel: fc.constantFrom(undefined, 'pool=a', 'pool=b', 'name=p0'),
      session: fc.constantFrom(undefined, undefined, 's1', 's2'),
    })
    .map(({ r, t, sel, session }) =>
      cmd(`open(r${r}, ${TARGETS[t]}, ${sel ?? '-'}, ${session ?? '-'})`, async (w) => {
        const rep = w.replicas[r % w.replicas.length]!;
        const got = await acquire(rep, w.clock, TARGETS[t]!, {
          ...(sel ? { selector: sel } : {}),
          ...(session ? { session } : {}),
        });
        if (got.ok) rep.open.push(got.acquired);
        else seen.refused++;
        if (got.ok) seen.opened++;
      }),
    ),
  fc.record({ r: replicaIdx, i: fc.nat() }).map(({ r, i }) =>
    cmd(`close(r${r}, ${i})`, async (w) => {
      const rep = w.replicas[r % w.replicas.length]!;
      if (rep.open.length === 0) return;
      const [a] = rep.open.splice(i % rep.open.length, 1);
      rep.chooser.release(a!);
    }),
  ),
  fc.record({ r: replicaIdx, i: fc.nat(), keep: fc.boolean() }).map(({ r, i, keep }) =>
    cmd(`block(r${r}, ${i}, ${keep ? 'keep' : 'close'})`, async (w) => {
      const rep = w.replicas[r % w.replicas.length]!;
      if (rep.open.length === 0) return;
      const a = rep.open[i % rep.open.length]!;
      rep.chooser.report(a, 'blocked');
      w.blocks.push([a.upstream.key, a.target!, w.clock.now() + DEFAULT_BLOCKED_COOLDOWN_SECONDS * 1000]);
      if (!keep) {
        rep.open.splice(i % rep.open.length, 1);
        rep.chooser.release(a);
      }
    }),
  ),
  fc.constantFrom(undefined, 'pool=a', 'name=p0').map((sel) =>
    cmd(
      `apiLease(${sel ?? '-'})`,
      async (w) => {
        const got = w.leader!.store.lease({ ttlSeconds: 3600, ...(sel ? { selector: sel } : {}) });
        if (got.granted)
          w.api.push({ id: got.grant.id, key: `${got.grant.proxy.namespace}/${got.grant.proxy.name}` });
      },
      (w) => w.leader !== undefined,
    ),
  ),
  fc.nat().map((i) =>
    cmd(
      `apiRelease(${i})`,
      async (w) => {
        if (w.api.length === 0) return;
        const [l] = w.api.splice(i % w.api.length, 1);
        w.leader!.store.release(l!.id);
      },
      (w) => w.leader !== undefined,
    ),
  ),
  fc.record({ r: replicaIdx }).map(({ r }) =>
    cmd(`sync(r${r})`, async (w) => {
      await sync(w.replicas[r % w.replicas.length]!);
    }),
  ),
  fc.integer({ min: 1, max: MAX_TICK_MS }).map((ms) =>
    cmd(`tick(${ms})`, async (w) => {
      if (!w.leader && w.clock.now() + ms - w.leaderlessSince > MAX_GAP_MS) return;
      w.clock.advance(ms);
      await w.syncAll();
      // The data path renews open connections; one it may not renew is cut.
      for (const r of w.replicas) {
        for (const a of [...r.open]) {
          if (r.chooser.renew(a.leaseId)) continue;
          r.open.splice(r.open.indexOf(a), 1);
          r.chooser.release(a);
        }
      }
    }),
  ),
  fc.constant(
    cmd(
      'stepDown',
      async (w) => {
        w.state = stepDown(w.leader!);
        w.leader = undefined;
        w.leaderlessSince = w.clock.now();
      },
      (w) => w.leader !== undefined,
    ),
  ),
  fc.constant(
    cmd(
      'takeOver',
      async (w) => {
        w.leader = newLeader(w.clock, w.fleet, w.state);
        seen.takeOvers++;
      },
      (w) => w.leader === undefined,
    ),
  ),
  fc.constant(
    cmd(
      'settleAndProbeBlocks',
      async (w) => {
        await w.syncAll();
        await w.syncAll();
        const now = w.clock.now();
        for (const [key, target, until] of w.blocks) {
          if (until <= now + 10_000) continue;
          for (const [i, r] of w.replicas.entries()) {
            const got = await acquire(r, w.clock, target, {
              selector: `name=${key.slice(key.indexOf('/') + 1)}`,
            });
            if (got.ok) {
              r.chooser.release(got.acquired);
              throw new Error(`replica ${i} chose ${key} for ${target}, blocked through a replica`);
            }
            seen.blocksProbed++;
          }
        }
      },
      (w) => w.leader !== undefined,
    ),
  ),
];

/** Connections and syncs are what the accounting is about: they come up most often. */
const commands = [
  open,
  open,
  open,
  close,
  close,
  block,
  apiLease,
  apiRelease,
  syncOne,
  syncOne,
  tick,
  tick,
  down,
  up,
  probe,
];

describe('gateway scale-out, model-based', () => {
  it('never exceeds maxLeases across replicas and API leases; blocks reach every replica', async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.integer({ min: 2, max: 4 }),
        fc.array(fc.constantFrom(0, 1, 2, 3), { minLength: 2, maxLength: 4 }),
        fc.commands(commands, { maxCommands: 80, size: 'max' }),
        async (replicas, caps, cmds) => {
          const w = new World(caps, replicas);
          try {
            await w.start();
            await fc.asyncModelRun(() => ({ model: {}, real: w }), cmds);
          } finally {
            w.close();
          }
        },
      ),
      { seed: TEST_SEED, numRuns: 400 },
    );
    for (const [what, n] of Object.entries(seen)) expect(n, what).toBeGreaterThan(50);
  });
});
