/**
 * controller/external — an External Proxy: nothing to provision, Ready at `spec.endpoint`,
 * and no finalizer of ours to hold its deletion (an old one is released).
 */
import { FINALIZER, PROVISIONED_REASONS } from '../api/constants.ts';
import type { ProxyObject } from '../api/proxy.ts';
import { proxyUrl } from '../api/url.ts';
import type { ReconcileContext, ReconcileResult } from './context.ts';
import { releaseFinalizer } from './deletion.ts';
import { labelReferencedSecret } from './inputs.ts';
import { notProvisioned } from './status.ts';
import { writeStatus } from './writer.ts';

export async function reconcileExternal(ctx: ReconcileContext, p: ProxyObject): Promise<ReconcileResult> {
  if (p.metadata.deletionTimestamp) {
    if (p.metadata.finalizers?.includes(FINALIZER)) await releaseFinalizer(ctx, p);
    return {};
  }
  if (p.spec.credentialsSecretRef) {
    // Served with these credentials by the lease feed and the health engine: keep it watched.
    const secret = await ctx.credentials.secretFor(p, ctx.signal);
    if (secret) await labelReferencedSecret(ctx, secret);
  }
  const ep = p.spec.endpoint;
  if (!ep) {
    // The schema forbids this; a hand-edited standalone file may not have been validated.
    const msg = 'spec.endpoint is required for External proxies';
    await writeStatus(ctx, p, notProvisioned(PROVISIONED_REASONS.invalid, msg, 'Failed'));
    return {};
  }
  await writeStatus(ctx, p, {
    phase: 'Ready',
    providerID: null,
    instanceName: null,
    address: ep.host,
    port: ep.port,
    url: proxyUrl(ep.host, ep.port),
    message: null,
    provisioned: {
      status: 'True',
      reason: PROVISIONED_REASONS.external,
      message: 'external endpoint, nothing provisioned',
    },
  });
  return {};
}
