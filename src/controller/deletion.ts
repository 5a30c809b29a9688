/**
 * controller/deletion — a Proxy being deleted: its instances (recorded and retiring) go
 * first, then the generated credentials Secret, then the finalizer. The finalizer stays on
 * any failure, since dropping it would leak a running instance; the `skip-cleanup`
 * annotation abandons the instances on purpose.
 */
import { ANNOTATION_SKIP_CLEANUP, FINALIZER } from '../api/constants.ts';
import { keyOf } from '../api/meta.ts';
import { type ProxyObject, proxyType } from '../api/proxy.ts';
import { errorMessage } from '../log/errors.ts';
import { cleanupInstances } from './cleanup.ts';
import { type ReconcileContext, ReconcileError, type ReconcileResult } from './context.ts';
import { deleteServedCredentials } from './generations.ts';
import { deleteGeneratedCredentials } from './inputs.ts';
import { lookupProvider } from './providers.ts';
import { writeStatus } from './writer.ts';

/** Drops the finalizer: the last act of a deletion. */
export async function releaseFinalizer(ctx: ReconcileContext, p: ProxyObject): Promise<ReconcileResult> {
  // Secret first: once the finalizer is gone nothing comes back for it, and standalone mode
  // has no owner-reference GC — a crash in between would leave it behind for good.
  await deleteGeneratedCredentials(ctx, p);
  await deleteServedCredentials(ctx, p);
  await ctx.store.proxies.removeFinalizer(p, FINALIZER, { signal: ctx.signal });
  ctx.log.info({ from: p.status?.phase ?? 'Pending' }, 'proxy deleted');
  return {};
}

export async function reconcileDeletion(ctx: ReconcileContext, p: ProxyObject): Promise<ReconcileResult> {
  if (!p.metadata.finalizers?.includes(FINALIZER)) return {};
  ctx.surge.forget(keyOf(p));
  const providerID = p.status?.providerID;
  // Every instance status knows of goes with the Proxy: a replacement in flight and the
  // draining ones too, without waiting for the orphan sweep.
  const retiring = [
    ...new Set([
      ...(p.status?.pending ? [p.status.pending.providerID] : []),
      ...(p.status?.draining ?? []).map((d) => d.providerID),
      ...(p.status?.retiring ?? []),
    ]),
  ].filter((id) => id !== providerID);
  if (proxyType(p.spec) === 'External' || (!providerID && retiring.length === 0)) {
    // Nothing was recorded as created; orphan sweep reaps what a crashed create left behind.
    return releaseFinalizer(ctx, p);
  }
  if (p.metadata.annotations?.[ANNOTATION_SKIP_CLEANUP] === 'true') {
    // Before the provider lookup, so it also frees a Proxy whose provider left the config.
    ctx.log.info(
      { providerID, retiring, provider: p.spec.provider },
      `${ANNOTATION_SKIP_CLEANUP} is set; abandoning the instance`,
    );
    return releaseFinalizer(ctx, p);
  }
  const provider = lookupProvider(ctx, p);
  if (!provider) {
    const msg = `provider "${p.spec.provider}" is not configured; cannot clean up instance ${providerID ?? retiring.join(', ')} (annotate the Proxy ${ANNOTATION_SKIP_CLEANUP}: "true" to abandon it)`;
    await writeStatus(ctx, p, { phase: 'Deleting', message: msg });
    throw new ReconcileError(msg);
  }
  const ids = [...(providerID ? [providerID] : []), ...retiring];
  const { pending, errors } = await cleanupInstances(ctx, provider, ids);
  if (errors.length > 0) {
    const msg = `cleanup failed: ${errors.map(errorMessage).join('; ')}`;
    await writeStatus(ctx, p, { phase: 'Deleting', message: msg });
    throw new ReconcileError(msg, { cause: errors.length === 1 ? errors[0] : new AggregateError(errors) });
  }
  if (pending.length === 0) return releaseFinalizer(ctx, p);
  await writeStatus(ctx, p, { phase: 'Deleting', message: `waiting for ${pending.join(', ')} to go away` });
  return { requeueAfter: ctx.options.deletionPollMs };
}
