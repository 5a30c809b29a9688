/**
 * controller/writer — the reconciler's one status writer: the intent is merged into the
 * freshest object and only a diff is patched, preconditioned on its resourceVersion; a
 * Conflict re-reads and tries again a bounded number of times (runtime/retry). It also writes
 * the log line a person follows a proxy by: one per phase change.
 */
import type { ProxyObject, ProxyStatus } from '../api/proxy.ts';
import type { Logger } from '../log/index.ts';
import { retryOnConflict } from '../runtime/retry.ts';
import { StoreError } from '../runtime/store.ts';
import type { ReconcileContext } from './context.ts';
import { applyIntent, phaseChange, type StatusIntent, statusPatch } from './status.ts';

/** Patches `intent` into the status of `p` (no write when nothing changes); returns the stored object. */
export function writeStatus(
  ctx: ReconcileContext,
  p: ProxyObject,
  intent: StatusIntent,
): Promise<ProxyObject> {
  return retryOnConflict(
    p,
    async (base) => {
      const next = applyIntent(base.status, intent, ctx.now(), base.metadata.generation);
      const patch = statusPatch(base.status, next);
      if (!patch) return base;
      const rv = base.metadata.resourceVersion;
      const written = await ctx.store.proxies.patchStatus(ctx.key, patch, {
        signal: ctx.signal,
        ...(rv ? { resourceVersion: rv } : {}),
      });
      logPhaseChange(ctx.log, base.status, written.status);
      return written;
    },
    async () => {
      const fresh = await ctx.store.proxies.read(ctx.key, { signal: ctx.signal });
      // A Proxy deleted and re-created under the same name is another object: not ours to write.
      if (fresh.metadata.uid !== p.metadata.uid) {
        throw new StoreError('Conflict', 409, `proxies ${p.metadata.name}: replaced by another object`);
      }
      return fresh;
    },
    { attempts: ctx.options.conflictRetries, signal: ctx.signal },
  );
}

function logPhaseChange(log: Logger, before: ProxyStatus | undefined, after: ProxyStatus | undefined): void {
  const change = phaseChange(before, after);
  if (change?.to === 'Failed') log.warn(change, 'proxy phase changed');
  else if (change) log.info(change, 'proxy phase changed');
  else if (before?.providerID && after?.providerID && before.providerID !== after.providerID) {
    // A replacement that was Running at once never passes through Replacing.
    log.info(
      {
        phase: after.phase,
        providerID: after.providerID,
        previousProviderID: before.providerID,
        address: after.address,
      },
      'proxy switched to a new instance',
    );
  }
}
