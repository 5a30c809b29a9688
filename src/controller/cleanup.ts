/**
 * controller/cleanup — the one loop that makes instances go away: for each provider ID, ask
 * for its deletion and poll until the provider answers NotFound. Used for a Proxy being
 * deleted and for the `status.retiring` IDs a replacement left behind.
 */
import type { ProxyObject } from '../api/proxy.ts';
import { errorMessage } from '../log/errors.ts';
import type { Provider } from '../provider/contract.ts';
import { classify } from '../provider/errors.ts';
import { type ReconcileContext, ReconcileError, type ReconcileResult } from './context.ts';
import { writeStatus } from './writer.ts';

/** One ID: 'gone' when the provider confirms it, 'pending' after asking for its deletion. */
async function cleanupOne(
  ctx: ReconcileContext,
  provider: Provider,
  id: string,
): Promise<'gone' | 'pending'> {
  try {
    await provider.get(ctx.call, id);
  } catch (err) {
    const cls = classify(err);
    if (cls === 'NotFound') return 'gone';
    if (cls !== 'Permanent') throw err;
    // Get cannot answer for this ID (a retired host, an unresolvable ID); delete is
    // idempotent and may still finish, so its success is the release signal.
    try {
      await provider.delete(ctx.call, id);
    } catch (delErr) {
      throw new AggregateError([err, delErr], `${errorMessage(err)}; delete: ${errorMessage(delErr)}`);
    }
    ctx.log.info({ providerID: id, err }, 'instance unreachable but delete succeeded');
    return 'gone';
  }
  await provider.delete(ctx.call, id);
  return 'pending';
}

export interface CleanupOutcome {
  /** IDs still there (deletion asked for, or failed). */
  remaining: string[];
  /** IDs whose deletion was asked for and is awaited. */
  pending: string[];
  errors: unknown[];
}

/** Runs `cleanupOne` over every ID; one failure does not stop the others. */
export async function cleanupInstances(
  ctx: ReconcileContext,
  provider: Provider,
  ids: readonly string[],
): Promise<CleanupOutcome> {
  const out: CleanupOutcome = { remaining: [], pending: [], errors: [] };
  for (const id of ids) {
    try {
      if ((await cleanupOne(ctx, provider, id)) === 'pending') {
        out.pending.push(id);
        out.remaining.push(id);
      }
    } catch (err) {
      out.remaining.push(id);
      out.errors.push(err);
    }
  }
  return out;
}

/**
 * Every pass: delete the retiring IDs and drop the confirmed-gone ones from status. Polls
 * (at most the deletion poll) while some remain; a failure goes to the queue after the
 * status write, so the gone ones are not asked for again.
 */
export async function cleanupRetiring(
  ctx: ReconcileContext,
  provider: Provider,
  p: ProxyObject,
  result: ReconcileResult,
): Promise<ReconcileResult> {
  const retiring = p.status?.retiring ?? [];
  if (retiring.length === 0) return result;
  const { remaining, errors } = await cleanupInstances(ctx, provider, retiring);
  if (remaining.length !== retiring.length) await writeStatus(ctx, p, { retiring: remaining });
  if (errors.length > 0) {
    const error = new AggregateError(
      errors,
      `deleting retired instances: ${errors.map(errorMessage).join('; ')}`,
    );
    throw new ReconcileError(errorMessage(error), { cause: error });
  }
  if (remaining.length === 0) return result;
  const poll = ctx.options.deletionPollMs;
  return { requeueAfter: Math.min(result.requeueAfter ?? poll, poll) };
}
