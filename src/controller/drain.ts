/**
 * controller/drain — replaced instances that still carry leases: after the switch an old
 * instance gets no new leases (it is in `status.draining`, which the lease API shows) and
 * moves to `retiring` — to be deleted — once this process's lease store holds no live lease
 * on it, or at the latest --drain-timeout after the switch. Polls while any drains.
 */
import { keyOf } from '../api/meta.ts';
import type { DrainingInstance, ProxyObject } from '../api/proxy.ts';
import type { ReconcileContext, ReconcileResult } from './context.ts';
import { dropUnusedGenerations } from './generations.ts';
import { writeStatus } from './writer.ts';

export interface Drained {
  proxy: ProxyObject;
  result: ReconcileResult;
}

/** Moves drained (or timed-out) instances to `retiring`; asks for a poll while some still drain. */
export async function advanceDrains(
  ctx: ReconcileContext,
  p: ProxyObject,
  result: ReconcileResult,
): Promise<Drained> {
  const draining = p.status?.draining ?? [];
  if (draining.length === 0) return { proxy: p, result };
  const key = keyOf(p);
  const now = ctx.nowMs();
  const done: DrainingInstance[] = [];
  const keep: DrainingInstance[] = [];
  let nextCheck = ctx.options.drainPollMs;
  for (const d of draining) {
    const since = Date.parse(d.since);
    const left = (Number.isNaN(since) ? now : since) + ctx.options.drainTimeoutMs - now;
    const leases = ctx.leasesOn(key, d.providerID);
    if (leases === 0 || left <= 0) {
      if (leases > 0) {
        ctx.log.warn(
          { providerID: d.providerID, leases },
          'drain timeout reached; deleting the instance under live leases',
        );
      } else ctx.log.info({ providerID: d.providerID }, 'replaced instance drained');
      done.push(d);
    } else {
      keep.push(d);
      nextCheck = Math.min(nextCheck, left);
    }
  }
  let proxy = p;
  if (done.length > 0) {
    proxy = await writeStatus(ctx, p, {
      draining: keep,
      retiring: [...(p.status?.retiring ?? []), ...done.map((d) => d.providerID)],
    });
    await dropUnusedGenerations(
      ctx,
      proxy,
      done.map((d) => d.credentialsGeneration),
    );
  }
  if (keep.length === 0) return { proxy, result };
  return { proxy, result: { requeueAfter: Math.min(result.requeueAfter ?? nextCheck, nextCheck) } };
}
