/**
 * controller/managed — a Managed Proxy that is not being deleted, row by row of the state
 * table in docs/architecture.md ("The Proxy state machine"): provider, inputs, permanent
 * failure, finalizer and spec-hash, an in-place restart (controller/restart), the instance, the
 * retiring IDs. Provider failures become
 * the Provisioned condition and the queue's retry policy; anything else goes to the queue.
 */
import { ANNOTATION_SPEC_HASH, FINALIZER, PROVISIONED_REASONS } from '../api/constants.ts';
import { keyOf } from '../api/meta.ts';
import type { ProxyObject } from '../api/proxy.ts';
import { errorMessage } from '../log/errors.ts';
import type { Provider } from '../provider/contract.ts';
import { classify, ProviderError } from '../provider/errors.ts';
import { claimOf } from '../provider/installation.ts';
import { instanceName } from '../provider/naming.ts';
import { RetryAfterError } from '../runtime/workqueue.ts';
import { cleanupRetiring } from './cleanup.ts';
import { type ReconcileContext, ReconcileError, type ReconcileResult, readyRequeue } from './context.ts';
import { advanceDrains } from './drain.ts';
import { ensureGeneration } from './generations.ts';
import { type Desired, resolveDesired } from './inputs.ts';
import { lookupProvider } from './providers.ts';
import { provisionOrReplace } from './provision.ts';
import { restartIfRequested } from './restart.ts';
import { rotateCredentials, untilNextRotation } from './rotation.ts';
import { notProvisioned, provisionedCondition } from './status.ts';
import { writeStatus } from './writer.ts';

export async function reconcileManaged(ctx: ReconcileContext, p0: ProxyObject): Promise<ReconcileResult> {
  let p = p0;
  const provider = lookupProvider(ctx, p);
  if (!provider) {
    const msg = `provider "${p.spec.provider ?? ''}" is not configured`;
    await writeStatus(ctx, p, notProvisioned(PROVISIONED_REASONS.providerNotConfigured, msg, 'Failed'));
    return {};
  }
  const uid = p.metadata.uid;
  if (!uid) throw new ReconcileError('Proxy has no metadata.uid');

  p = await rotateCredentials(ctx, p);
  const desired = await resolveDesired(ctx, p, uid);
  if ('reason' in desired) {
    // The labelled-Secret watch requeues the Proxy once the Secret is fixed.
    const hasInstance = Boolean(p.status?.providerID);
    await writeStatus(
      ctx,
      p,
      notProvisioned(desired.reason, desired.message, hasInstance ? undefined : 'Pending'),
    );
    throw new ReconcileError(desired.message);
  }
  if (failedForGood(p, desired.hash)) return {};

  let result: ReconcileResult;
  // Judged on the annotation as it was: the write below records the desired hash either way.
  const held = heldOnPermanentError(p, desired);
  try {
    p = await ensureFinalizerAndHash(ctx, provider, p, desired);
    if (held) {
      // The edit failed for good; the old instance keeps serving until the spec changes again.
      result = readyRequeue(ctx);
    } else {
      const generation = await ensureGeneration(ctx, p, desired.request.credentials);
      const want = { request: desired.request, generation };
      const step = await restartIfRequested(ctx, provider, p, want);
      p = step.proxy;
      ({ proxy: p, result } = step.result
        ? { proxy: p, result: step.result }
        : await provisionOrReplace(ctx, provider, p, want));
    }
  } catch (err) {
    if (!(err instanceof ProviderError) || ctx.signal.aborted) throw err;
    return onProviderError(ctx, provider, p, err);
  }
  ({ proxy: p, result } = await advanceDrains(ctx, p, result));
  return untilNextRotation(ctx, p, await cleanupRetiring(ctx, provider, p, result));
}

/** Whether a serving instance is recorded: a failed edit must leave it alone. */
function serves(p: ProxyObject): boolean {
  const s = p.status;
  return Boolean(s?.providerID && s.address && (s.phase === 'Ready' || s.phase === 'Replacing'));
}

/** A spec edit failed for good while the old instance serves: no retry at this generation and hash. */
function heldOnPermanentError(p: ProxyObject, desired: Desired): boolean {
  const cond = provisionedCondition(p.status);
  return (
    serves(p) &&
    p.status?.instanceName !== desired.request.name &&
    cond?.status === 'False' &&
    cond.reason === PROVISIONED_REASONS.permanent &&
    cond.observedGeneration === p.metadata.generation &&
    p.metadata.annotations?.[ANNOTATION_SPEC_HASH] === desired.hash
  );
}

/** A permanent failure waits for the spec (or a referenced Secret) to change. */
function failedForGood(p: ProxyObject, hash: string): boolean {
  const cond = provisionedCondition(p.status);
  return (
    p.status?.phase === 'Failed' &&
    cond?.reason === PROVISIONED_REASONS.permanent &&
    cond.observedGeneration === p.metadata.generation &&
    p.metadata.annotations?.[ANNOTATION_SPEC_HASH] === hash
  );
}

/**
 * The finalizer and the desired spec-hash, in one metadata write before anything is created
 * (crash safety: see docs/architecture.md). Instances of an earlier desired hash that status
 * never recorded are moved to `retiring` first, while the annotation still names them.
 */
async function ensureFinalizerAndHash(
  ctx: ReconcileContext,
  provider: Provider,
  p0: ProxyObject,
  desired: Desired,
): Promise<ProxyObject> {
  let p = p0;
  const annotations = p.metadata.annotations ?? {};
  const prev = annotations[ANNOTATION_SPEC_HASH];
  if (p.metadata.finalizers?.includes(FINALIZER) && prev === desired.hash) return p;
  const uid = desired.request.uid;
  if (prev && prev !== desired.hash && instanceName(uid, prev) !== p.status?.instanceName) {
    const strays = await findStrays(ctx, provider, p, desired.request.name);
    if (strays.length > 0) {
      ctx.log.info({ strays }, 'retiring unrecorded instances of an earlier spec');
      p = await writeStatus(ctx, p, { retiring: [...(p.status?.retiring ?? []), ...strays] });
    }
  }
  return ctx.store.proxies.update(
    {
      ...p,
      metadata: {
        ...p.metadata,
        finalizers: [...new Set([...(p.metadata.finalizers ?? []), FINALIZER])],
        annotations: { ...annotations, [ANNOTATION_SPEC_HASH]: desired.hash },
      },
    },
    { signal: ctx.signal },
  );
}

/**
 * Instances of this Proxy the status does not know about: after a crash between create and
 * the status write, followed by a spec change, the old name is never asked for again.
 */
async function findStrays(
  ctx: ReconcileContext,
  provider: Provider,
  p: ProxyObject,
  keepName: string,
): Promise<string[]> {
  const s = p.status;
  const known = new Set([
    s?.providerID,
    s?.pending?.providerID,
    ...(s?.draining ?? []).map((d) => d.providerID),
    ...(s?.retiring ?? []),
  ]);
  const uid = p.metadata.uid ?? '';
  const all = await provider.listByTag(ctx.call);
  return all
    .filter(
      (i) =>
        i.uid === uid &&
        claimOf(i, ctx.installation, new Set([uid])) === 'ours' &&
        !known.has(i.id) &&
        i.name !== keepName,
    )
    .map((i) => i.id);
}

/**
 * A provider failure → status + what the queue should do. Quota: fixed slow retry. Permanent:
 * Failed until the generation changes. Anything else: backoff, and a Ready status stays Ready
 * (one flaky call must not pull a serving proxy out of rotation).
 */
async function onProviderError(
  ctx: ReconcileContext,
  provider: Provider,
  p: ProxyObject,
  err: ProviderError,
): Promise<ReconcileResult> {
  const cls = classify(err);
  const msg = errorMessage(err);
  // A phase in progress stays; a proxy with none yet, or a Failed one now retrying, is Pending.
  const retryPhase = p.status?.phase && p.status.phase !== 'Failed' ? undefined : 'Pending';
  if (cls === 'QuotaExceeded') {
    await writeStatus(ctx, p, notProvisioned(PROVISIONED_REASONS.quota, msg, retryPhase));
    throw new RetryAfterError(msg, ctx.options.quotaBackoffMs, { cause: err });
  }
  if (cls === 'Permanent') {
    if (serves(p)) {
      // A failed spec edit: the old instance keeps serving (Ready), the condition names the error.
      const pending = p.status?.pending;
      ctx.log.warn(
        { reason: PROVISIONED_REASONS.permanent, message: msg, providerID: p.status?.providerID },
        'spec change failed for good; the serving instance stays',
      );
      await writeStatus(ctx, p, {
        ...notProvisioned(PROVISIONED_REASONS.permanent, msg, 'Ready'),
        ...(pending ? { pending: null, retiring: [...(p.status?.retiring ?? []), pending.providerID] } : {}),
      });
      ctx.surge.release(provider.name, keyOf(p));
      // A recorded replacement goes to `retiring`; the next pass deletes it.
      return pending ? { requeueAfter: ctx.options.deletionPollMs } : {};
    }
    await writeStatus(ctx, p, notProvisioned(PROVISIONED_REASONS.permanent, msg, 'Failed'));
    ctx.surge.release(provider.name, keyOf(p));
    return {};
  }
  if (!serves(p)) {
    await writeStatus(ctx, p, notProvisioned(PROVISIONED_REASONS.transient, msg, retryPhase));
  }
  throw new ReconcileError(msg, { cause: err });
}
