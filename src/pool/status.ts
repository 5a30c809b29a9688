/**
 * pool/status — a pool's status from its members (pure): the counts behind the printer
 * columns, the selector the scale subresource publishes, and the Available and Progressing
 * conditions (plus SpecValid when the spec asks for something no provider here can do).
 */
import { LABEL_POOL } from '../api/constants.ts';
import type { Condition } from '../api/meta.ts';
import type { ProxyPool, ProxyPoolStatus } from '../api/proxypool.ts';
import type { Member } from './members.ts';
import { activeMembers, isDueForRestart, isOutdated } from './plan.ts';

export const POOL_CONDITION_AVAILABLE = 'Available';
export const POOL_CONDITION_PROGRESSING = 'Progressing';
export const POOL_CONDITION_SPEC_VALID = 'SpecValid';

/** `crawl.example.com/pool=<name>`: the pool's Proxies, for list calls and `status.selector`. */
export function poolSelector(poolName: string): string {
  return `${LABEL_POOL}=${poolName}`;
}

type ConditionIntent = Omit<Condition, 'lastTransitionTime'>;

function progressing(
  replicas: number,
  active: number,
  updated: number,
  draining: number,
  restarting: number,
): { status: 'True' | 'False'; reason: string; message: string } {
  if (restarting > 0) {
    return {
      status: 'True',
      reason: 'Restarting',
      message: `${restarting} Proxies restarting in place for a new IP`,
    };
  }
  if (updated < active || (updated < replicas && active >= replicas)) {
    return { status: 'True', reason: 'RollingOut', message: `${updated} of ${replicas} Proxies updated` };
  }
  if (active < replicas) {
    return { status: 'True', reason: 'ScalingUp', message: `${active} of ${replicas} Proxies exist` };
  }
  if (active > replicas) {
    return { status: 'True', reason: 'ScalingDown', message: `${active} Proxies for ${replicas} replicas` };
  }
  if (draining > 0) {
    return { status: 'True', reason: 'Draining', message: `${draining} Proxies draining before deletion` };
  }
  return { status: 'False', reason: 'Complete', message: `${replicas} Proxies from the current template` };
}

export interface StatusInputs {
  pool: ProxyPool;
  members: Member[];
  replicas: number;
  maxUnavailable: number;
  nowMs: number;
  /** Why the spec cannot be acted on (e.g. an unsupported rotation strategy); undefined if it can. */
  invalid: string | undefined;
  /** Rotation strategy Restart. */
  restartInPlace?: boolean;
}

/** The status fields and conditions this pass observed (conditions without transition times). */
export function poolStatus(inputs: StatusInputs): {
  status: Omit<ProxyPoolStatus, 'conditions'>;
  conditions: ConditionIntent[];
} {
  const { pool, members, replicas, nowMs } = inputs;
  const active = activeMembers(members);
  const draining = members.filter((m) => m.drainingSinceMs !== undefined && !m.deleting).length;
  const restartInPlace = inputs.restartInPlace ?? false;
  const restarting = active.filter((m) => m.restarting).length;
  const updated = active.filter(
    (m) =>
      !isOutdated(m, nowMs, restartInPlace) &&
      !m.restarting &&
      !(restartInPlace && isDueForRestart(m, nowMs)),
  ).length;
  const leasable = active.filter((m) => m.leasable).length;
  const minLeasable = Math.max(0, replicas - inputs.maxUnavailable);
  const generation = pool.metadata.generation;
  const observed = generation !== undefined ? { observedGeneration: generation } : {};
  const status = {
    replicas: active.length,
    readyReplicas: active.filter((m) => m.ready).length,
    healthyReplicas: active.filter((m) => m.healthy).length,
    leasableReplicas: leasable,
    updatedReplicas: updated,
    drainingReplicas: draining,
    restartingReplicas: restarting,
    selector: poolSelector(pool.metadata.name),
    ...observed,
  };
  const progress = progressing(replicas, active.length, updated, draining, restarting);
  const conditions: ConditionIntent[] = [
    {
      type: POOL_CONDITION_AVAILABLE,
      status: leasable >= minLeasable ? 'True' : 'False',
      reason: leasable >= minLeasable ? 'MinimumLeasable' : 'BelowMinimum',
      message: `${leasable} leasable, at least ${minLeasable} wanted`,
      ...observed,
    },
    { type: POOL_CONDITION_PROGRESSING, ...progress, ...observed },
    inputs.invalid === undefined
      ? { type: POOL_CONDITION_SPEC_VALID, status: 'True', reason: 'Valid', message: '', ...observed }
      : {
          type: POOL_CONDITION_SPEC_VALID,
          status: 'False',
          reason: 'Unsupported',
          message: inputs.invalid,
          ...observed,
        },
  ];
  return { status, conditions };
}
