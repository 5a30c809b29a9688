/**
 * controller/rotation — `spec.credentialsRotation`: the generated `<proxy>-auth` credentials of a
 * Managed proxy are replaced once the interval has passed since the last rotation. Deleting the
 * Secret is the whole act: the same pass generates new credentials (controller/inputs), their
 * spec-hash names a new instance, and the health-gated replacement brings it up while the old
 * instance keeps serving and then drains. `status.credentialsRotatedAt` records when, so the
 * schedule survives restarts and a change of leader.
 */
import type { ProxyObject } from '../api/proxy.ts';
import type { ReconcileContext, ReconcileResult } from './context.ts';
import { deleteGeneratedCredentials } from './inputs.ts';
import { writeStatus } from './writer.ts';

/** The rotation interval in ms, or undefined when the proxy's credentials are not rotated. */
function intervalMs(p: ProxyObject): number | undefined {
  const r = p.spec.credentialsRotation;
  // Referenced credentials are the user's (validation refuses the combination; this is the guard).
  if (!r || p.spec.credentialsSecretRef) return undefined;
  return r.intervalSeconds * 1000;
}

function lastRotation(p: ProxyObject): number | undefined {
  const at = Date.parse(p.status?.credentialsRotatedAt ?? '');
  return Number.isNaN(at) ? undefined : at;
}

/**
 * Rotates when due and returns the Proxy as stored. The first pass with rotation on only starts
 * the clock: credentials that existed before are rotated one interval later, not at once. While
 * a replacement is pending, a due rotation waits, so two replacements never chase each other.
 */
export async function rotateCredentials(ctx: ReconcileContext, p: ProxyObject): Promise<ProxyObject> {
  const every = intervalMs(p);
  if (every === undefined) return p;
  const now = ctx.nowMs();
  const last = lastRotation(p);
  if (last === undefined) return writeStatus(ctx, p, { credentialsRotatedAt: new Date(now).toISOString() });
  if (now - last < every || p.status?.pending) return p;
  await deleteGeneratedCredentials(ctx, p);
  ctx.log.info({ intervalSeconds: every / 1000 }, 'rotating the generated proxy credentials');
  return writeStatus(ctx, p, { credentialsRotatedAt: new Date(now).toISOString() });
}

/** `result`, asking to come back no later than the next rotation is due. */
export function untilNextRotation(
  ctx: ReconcileContext,
  p: ProxyObject,
  result: ReconcileResult,
): ReconcileResult {
  const every = intervalMs(p);
  const last = lastRotation(p);
  if (every === undefined || last === undefined) return result;
  // A due rotation waiting for a pending replacement is retried with the replacement's polls.
  const due = Math.max(1000, last + every - ctx.nowMs());
  return result.requeueAfter !== undefined && result.requeueAfter <= due
    ? result
    : { ...result, requeueAfter: due };
}
