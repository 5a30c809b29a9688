/**
 * test/unit/pool/plan — the pool controller's decisions as pure arithmetic: the victim order down to
 * "oldest first", what maxSurge and maxUnavailable allow in one pass, when a drained or
 * timed-out victim goes, and in-place restarts under rotation strategy Restart.
 */
import { describe, expect, it } from 'vitest';
import type { ProxyObject } from '../../../src/api/proxy.ts';
import type { Member } from '../../../src/pool/members.ts';
import { jitterFactor, rotationDue } from '../../../src/pool/members.ts';
import { type PlanInputs, planPool } from '../../../src/pool/plan.ts';

function member(name: string, over: Partial<Member> = {}): Member {
  return {
    proxy: { metadata: { name, namespace: 'crawl' }, spec: {} } as ProxyObject,
    key: `crawl/${name}`,
    ready: true,
    healthy: true,
    leasable: true,
    current: true,
    rotateAtMs: Number.POSITIVE_INFINITY,
    bornMs: 0,
    drainingSinceMs: undefined,
    deleting: false,
    leases: 0,
    restarting: false,
    restartDone: false,
    restartDoneAtMs: Number.NaN,
    restartFailed: false,
    ...over,
  };
}

const inputs = (members: Member[], over: Partial<PlanInputs> = {}): PlanInputs => ({
  members,
  replicas: members.length,
  maxSurge: 1,
  maxUnavailable: 0,
  nowMs: 1_000_000,
  drainTimeoutMs: 600_000,
  drainPollMs: 5_000,
  ...over,
});

const names = (ms: Member[]) => ms.map((m) => m.proxy.metadata.name);

describe('pool plan', () => {
  it('scales down not Ready, then unhealthy, then fewest leases, then oldest', () => {
    const ms = [
      member('busy', { leases: 2 }),
      member('young', { bornMs: 300 }),
      member('old', { bornMs: 100 }),
      member('sick', { healthy: false, leasable: false }),
      member('down', { ready: false, healthy: false, leasable: false }),
      member('one-lease', { leases: 1, bornMs: 0 }),
    ];
    expect(names(planPool(inputs(ms, { replicas: 1 })).drain)).toEqual([
      'down',
      'sick',
      'old',
      'young',
      'one-lease',
    ]);
    expect(names(planPool(inputs(ms, { replicas: 4 })).drain)).toEqual(['down', 'sick']);
  });

  it('rolls out within maxSurge while maxUnavailable is 0, and in bigger steps when it is not', () => {
    const outdated = ['a', 'b', 'c', 'd'].map((n) => member(n, { current: false }));
    const first = planPool(inputs(outdated));
    expect(first).toMatchObject({ create: 1, drain: [] });
    // Two may be unavailable and two may surge: two drained at once, and new ones fill the
    // pool up to replicas + maxSurge (2 outdated left + 4 new = 6).
    const wide = planPool(inputs(outdated, { maxSurge: 2, maxUnavailable: 2 }));
    expect(wide.drain).toHaveLength(2);
    expect(wide.create).toBe(4);
    // The new one is leasable: one outdated proxy may go, and one more new one comes.
    const next = planPool(inputs([...outdated, member('new')], { replicas: 4 }));
    expect(names(next.drain)).toEqual(['a']);
    expect(next.create).toBe(1);
    // Not leasable yet: nothing outdated goes, nothing more is created.
    const waiting = planPool(
      inputs([...outdated, member('new', { healthy: false, leasable: false })], { replicas: 4 }),
    );
    expect(waiting).toMatchObject({ create: 0, drain: [] });
  });

  it('deletes a victim once its leases end or its drain timed out, and polls meanwhile', () => {
    const now = 1_000_000;
    const ms = [
      member('keep'),
      member('held', { drainingSinceMs: now - 1_000, leases: 1, leasable: false }),
      member('free', { drainingSinceMs: now - 1_000, leases: 0, leasable: false }),
      member('late', { drainingSinceMs: now - 600_000, leases: 3, leasable: false }),
    ];
    const plan = planPool(inputs(ms, { replicas: 1 }));
    expect(names(plan.remove).sort()).toEqual(['free', 'late']);
    expect(plan.create).toBe(0);
    expect(plan.requeueAfterMs).toBe(5_000);
  });

  it('rotates each proxy at maxAge × (1 − jitter × r), r fixed per UID', () => {
    const r = jitterFactor('uid-1');
    expect(r).toBeGreaterThanOrEqual(0);
    expect(r).toBeLessThan(1);
    expect(jitterFactor('uid-1')).toBe(r);
    expect(rotationDue({ maxAge: '100s', jitter: 0.5 }, 'uid-1', 0)).toBe(
      Math.round(100_000 * (1 - 0.5 * r)),
    );
    expect(rotationDue(undefined, 'uid-1', 0)).toBe(Number.POSITIVE_INFINITY);
    const due = planPool(
      inputs([member('a', { rotateAtMs: 999_000 }), member('b', { rotateAtMs: 1_030_000 })]),
    );
    expect(due.create).toBe(1); // a is due: a surge replacement
    expect(due.requeueAfterMs).toBe(30_000); // b's turn
  });

  it('strategy Restart: aged Proxies restart in place, as many as maxUnavailable allows, none replaced', () => {
    const now = 1_000_000;
    const aged = ['a', 'b', 'c', 'd'].map((n, i) => member(n, { rotateAtMs: now - 4_000 + i * 1_000 }));
    const restart = { restartInPlace: true, maxUnavailable: 1 };
    const first = planPool(inputs(aged, restart));
    // The longest overdue first, one at a time (maxUnavailable 1); no surge Proxy, no drain.
    expect(names(first.restart)).toEqual(['a']);
    expect(first).toMatchObject({ create: 0, drain: [], remove: [], resume: [] });
    expect(first.requeueAfterMs).toBe(5_000);
    expect(names(planPool(inputs(aged, { ...restart, maxUnavailable: 2 })).restart)).toEqual(['a', 'b']);
    // a restarting (drained, not leasable): the others wait for it.
    const restarting = member('a', { restarting: true, leasable: false, ready: false, healthy: false });
    const waiting = planPool(inputs([restarting, ...aged.slice(1)], restart));
    expect(waiting).toMatchObject({ create: 0, drain: [], restart: [], resume: [] });
    // Done, but its new instance has not passed yet: still waiting.
    const unjudged = member('a', { restarting: true, restartDone: true, leasable: false, healthy: false });
    expect(planPool(inputs([unjudged, ...aged.slice(1)], restart))).toMatchObject({
      restart: [],
      resume: [],
    });
    // Healthy again: the drain is lifted; the next one goes once a is leasable again.
    const passed = member('a', {
      restarting: true,
      restartDone: true,
      leasable: false,
      rotateAtMs: now + 60_000,
    });
    const back = planPool(inputs([passed, ...aged.slice(1)], restart));
    expect(names(back.resume)).toEqual(['a']);
    expect(back.restart).toEqual([]);
    const next = planPool(inputs([member('a', { rotateAtMs: now + 60_000 }), ...aged.slice(1)], restart));
    expect(names(next.restart)).toEqual(['b']);
  });

  it('strategy Restart: a failed restart is replaced; template changes still roll out by replacement', () => {
    const now = 1_000_000;
    const restart = { restartInPlace: true, maxUnavailable: 1 };
    const failed = member('a', { restarting: true, restartFailed: true, leasable: false, healthy: false });
    const plan = planPool(inputs([failed, member('b'), member('c')], restart));
    expect(names(plan.drain)).toEqual(['a']);
    expect(plan.create).toBe(1);
    // Done, but never healthy within the drain timeout: replaced like a failed one.
    const done = { restarting: true, restartDone: true, healthy: false, leasable: false };
    const recent = member('a', { ...done, restartDoneAtMs: now - 1_000 });
    expect(planPool(inputs([recent, member('b'), member('c')], restart)).drain).toEqual([]);
    const stuck = member('a', { ...done, restartDoneAtMs: now - 600_000 });
    expect(names(planPool(inputs([stuck, member('b'), member('c')], restart)).drain)).toEqual(['a']);
    const outdated = [member('x', { current: false, rotateAtMs: now - 1 }), member('y', { current: false })];
    const roll = planPool(inputs(outdated, restart));
    expect(roll.restart).toEqual([]);
    expect(roll.create).toBeGreaterThan(0);
  });
});
