/**
 * pool/plan — one pass of the pool controller as a pure decision (see docs/configuration.md,
 * "ProxyPool"): how many Proxies to create, which to start draining, which drained ones to
 * delete, and when to look again. Like a Deployment's rolling update, with the pool's Proxies
 * as pods: at most `replicas + maxSurge` Proxies take part, and an outdated Proxy (older
 * template, or due for age rotation) is drained only while the leasable ones stay at or above
 * `replicas − maxUnavailable` without it. With rotation `strategy: Restart`, a Proxy due for age
 * rotation is not replaced but restarted in place (a new IP, same instance), under the same
 * minimum: it counts as unavailable from the request until it passes its health checks again.
 */
import { type Member, victimOrder } from './members.ts';

export interface PlanInputs {
  members: Member[];
  replicas: number;
  maxSurge: number;
  maxUnavailable: number;
  nowMs: number;
  /** A draining Proxy is deleted once its leases end, or this long after its drain began. */
  drainTimeoutMs: number;
  /** How often a drain without an event to wake the controller is looked at again. */
  drainPollMs: number;
  /** Rotation strategy Restart: age rotation restarts Proxies in place instead of replacing them. */
  restartInPlace?: boolean;
}

export interface PoolPlan {
  create: number;
  /** Start draining (no new leases); deleted on a later pass once drained. */
  drain: Member[];
  /** Drained, or past the drain timeout: delete now. */
  remove: Member[];
  /** Due for age rotation, strategy Restart: ask for an in-place restart (no new leases meanwhile). */
  restart: Member[];
  /** Restarted and healthy again: lift the drain, leases may come. */
  resume: Member[];
  /** Look again this many ms from now (rotation or a drain), if nothing else wakes the pool. */
  requeueAfterMs: number | undefined;
}

/**
 * Whether `m` has to be replaced: made from an older template, or due for age rotation — unless
 * age rotation restarts in place — or its in-place restart failed.
 */
export function isOutdated(m: Member, nowMs: number, restartInPlace = false): boolean {
  return !m.current || m.restartFailed || (!restartInPlace && nowMs >= m.rotateAtMs);
}

/** Due for an in-place restart (strategy Restart): current, aged, not restarting already. */
export function isDueForRestart(m: Member, nowMs: number): boolean {
  return m.current && !m.restarting && !m.restartFailed && nowMs >= m.rotateAtMs;
}

/** The Proxies that count toward replicas: not draining away, not being deleted. */
export function activeMembers(members: Member[]): Member[] {
  return members.filter((m) => m.drainingSinceMs === undefined && !m.deleting);
}

/** Which draining members are done (no leases, or past the timeout), and when to look again. */
function finishedDrains(inputs: PlanInputs): { remove: Member[]; nextMs: number | undefined } {
  const remove: Member[] = [];
  let nextMs: number | undefined;
  for (const m of inputs.members) {
    if (m.drainingSinceMs === undefined || m.deleting) continue;
    const left = m.drainingSinceMs + inputs.drainTimeoutMs - inputs.nowMs;
    if (m.leases === 0 || left <= 0) remove.push(m);
    else nextMs = Math.min(nextMs ?? Number.POSITIVE_INFINITY, left, inputs.drainPollMs);
  }
  return { remove, nextMs };
}

/**
 * Victims among the active members. Without outdated ones it is a plain scale-down in victim
 * order. During a roll-out, current Proxies beyond `replicas` go first, then outdated ones: an
 * outdated Proxy that is not leasable costs nothing and goes at once, a leasable one only while
 * the leasable count stays at or above the minimum without it.
 */
function victims(active: Member[], inputs: PlanInputs): Member[] {
  const { replicas, nowMs } = inputs;
  const stale = (m: Member) => isOutdated(m, nowMs, inputs.restartInPlace);
  const outdated = active.filter(stale).sort(victimOrder);
  if (outdated.length === 0)
    return [...active].sort(victimOrder).slice(0, Math.max(0, active.length - replicas));
  const current = active.filter((m) => !stale(m)).sort(victimOrder);
  const out = current.slice(0, Math.max(0, current.length - replicas));
  const minLeasable = Math.max(0, replicas - inputs.maxUnavailable);
  let leasable = active.filter((m) => m.leasable && !out.includes(m)).length;
  for (const m of outdated) {
    if (!m.leasable) out.push(m);
    else if (leasable - 1 >= minLeasable) {
      out.push(m);
      leasable -= 1;
    }
  }
  return out;
}

/** How many new Proxies this pass creates, after `drained` leave the active set. */
function creations(active: Member[], drained: Member[], inputs: PlanInputs): number {
  const { replicas, nowMs } = inputs;
  const remaining = active.filter((m) => !drained.includes(m));
  const current = remaining.filter((m) => !isOutdated(m, nowMs, inputs.restartInPlace)).length;
  const outdated = remaining.length - current;
  if (outdated === 0) return Math.max(0, replicas - remaining.length);
  return Math.max(0, Math.min(replicas - current, replicas + inputs.maxSurge - remaining.length));
}

/**
 * In-place restarts to ask for (strategy Restart), the longest overdue first: one that is not
 * leasable costs nothing; a leasable one only while the leasable count stays at or above
 * `replicas − maxUnavailable` without it. None while a replacement roll-out or a scale-down runs.
 */
function restarts(active: Member[], drained: Member[], inputs: PlanInputs): Member[] {
  const { replicas, nowMs } = inputs;
  if (!inputs.restartInPlace || drained.length > 0) return [];
  if (active.length !== replicas || active.some((m) => isOutdated(m, nowMs, true))) return [];
  const due = active
    .filter((m) => isDueForRestart(m, nowMs))
    .sort((a, b) => a.rotateAtMs - b.rotateAtMs || (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
  const minLeasable = Math.max(0, replicas - inputs.maxUnavailable);
  let leasable = active.filter((m) => m.leasable).length;
  const out: Member[] = [];
  for (const m of due) {
    if (!m.leasable) out.push(m);
    else if (leasable - 1 >= minLeasable) {
      out.push(m);
      leasable -= 1;
    }
  }
  return out;
}

/** Restarted Proxies whose new instance passed its health checks: they take leases again. */
function finishedRestarts(active: Member[]): Member[] {
  return active.filter((m) => m.restarting && m.restartDone && m.healthy);
}

/** The earliest future rotation of a current member, as a delay from now. */
function nextRotation(active: Member[], nowMs: number): number | undefined {
  let next: number | undefined;
  for (const m of active) {
    if (!Number.isFinite(m.rotateAtMs) || m.rotateAtMs <= nowMs) continue;
    next = Math.min(next ?? Number.POSITIVE_INFINITY, m.rotateAtMs - nowMs);
  }
  return next;
}

/**
 * A restart that ended (Done) but whose new instance has not passed its health checks within
 * the drain timeout counts as failed: the Proxy is replaced, rather than holding a place under
 * maxUnavailable for ever.
 */
function withStuckRestarts(inputs: PlanInputs): PlanInputs {
  const stuck = (m: Member) =>
    m.restarting &&
    m.restartDone &&
    !m.healthy &&
    !m.restartFailed &&
    inputs.nowMs - (Number.isNaN(m.restartDoneAtMs) ? inputs.nowMs : m.restartDoneAtMs) >=
      inputs.drainTimeoutMs;
  if (!inputs.members.some(stuck)) return inputs;
  return { ...inputs, members: inputs.members.map((m) => (stuck(m) ? { ...m, restartFailed: true } : m)) };
}

export function planPool(given: PlanInputs): PoolPlan {
  const inputs = withStuckRestarts(given);
  const active = activeMembers(inputs.members);
  const drain = victims(active, inputs);
  const create = creations(active, drain, inputs);
  const { remove, nextMs } = finishedDrains(inputs);
  const restart = restarts(active, drain, inputs);
  // Also after a switch to Replace: a finished restart must not stay drained.
  const resume = finishedRestarts(active);
  const waits = [nextMs, nextRotation(active, inputs.nowMs)].filter((x): x is number => x !== undefined);
  // Something just started draining: look again soon, its leases may be gone already.
  if (drain.length > 0) waits.push(0);
  // Due restarts held back by the minimum wait for an event of a restarting Proxy, or a poll.
  const held =
    inputs.restartInPlace && active.some((m) => isDueForRestart(m, inputs.nowMs) && !restart.includes(m));
  if (held) waits.push(inputs.drainPollMs);
  return {
    create,
    drain,
    remove,
    restart,
    resume,
    requeueAfterMs: waits.length > 0 ? Math.min(...waits) : undefined,
  };
}
