/**
 * controller/restart — an in-place restart for a new IP (pool rotation `strategy: Restart`; see
 * docs/configuration.md): asked for by the `crawl.example.com/restart-requested` annotation
 * (the pool sets it with spec.drain, so the lease store stops granting the proxy), answered in
 * status.restart:
 *
 *   Draining   — at least one drain poll (the lease stores see spec.drain), then until the
 *                proxy's live leases end, at most --drain-timeout;
 *   Restarting — the proxy serves nothing (phase Restarting, no address, so the health engine
 *                drops its verdict to Unknown), and the provider stops and starts the instance,
 *                one call per pass until it runs again (the provider follows its operations);
 *   Done       — Ready at the new address; the health engine judges it from Unknown, and it is
 *                leased again only once it passes (the pool then lifts the drain);
 *   Failed     — the provider cannot restart it, or answered a permanent error: the normal rows
 *                take over (a stopped instance is then a lost one and is re-created).
 *
 * The restart's `since` is written before the provider is first asked, so a crash resumes the
 * same restart instead of starting another.
 */
import { ANNOTATION_RESTART_REQUESTED, PROVISIONED_REASONS } from '../api/constants.ts';
import { keyOf } from '../api/meta.ts';
import type { ProxyObject, RestartStatus } from '../api/proxy.ts';
import { errorMessage } from '../log/errors.ts';
import { canRestart, type Provider } from '../provider/contract.ts';
import { classify, ProviderError } from '../provider/errors.ts';
import { provisionPoll, type ReconcileContext, type ReconcileResult, readyRequeue } from './context.ts';
import { instanceVerdict, type Wanted } from './provision.ts';
import { readyIntent } from './status.ts';
import { writeStatus } from './writer.ts';

export interface RestartStep {
  proxy: ProxyObject;
  /** Set when the restart took this pass; undefined: the normal rows go on. */
  result?: ReconcileResult;
}

/** The restart asked for and not answered yet, or undefined. */
function openRequest(p: ProxyObject): string | undefined {
  const requested = p.metadata.annotations?.[ANNOTATION_RESTART_REQUESTED];
  if (!requested) return undefined;
  const r = p.status?.restart;
  if (r?.requestedAt === requested && (r.phase === 'Done' || r.phase === 'Failed')) return undefined;
  return requested;
}

export async function restartIfRequested(
  ctx: ReconcileContext,
  provider: Provider,
  p: ProxyObject,
  want: Wanted,
): Promise<RestartStep> {
  const r = p.status?.restart;
  const providerID = p.status?.providerID;
  // A restart under way is finished first: its instance may be stopped, which the normal rows
  // would take for a lost one.
  if (r?.phase === 'Restarting' && providerID) return restartNow(ctx, provider, p, want, r, providerID);
  const requested = openRequest(p);
  if (requested === undefined || !providerID) return { proxy: p };
  const s = p.status;
  // Only a proxy serving from its current spec, with no replacement under way, restarts.
  if (s?.phase !== 'Ready' || s.pending || s.instanceName !== want.request.name) return { proxy: p };
  if (!canRestart(provider)) {
    const message = `provider "${provider.name}" (type ${provider.type}) cannot restart an instance for a new IP`;
    ctx.log.warn({ requestedAt: requested }, message);
    return { proxy: await writeStatus(ctx, p, { restart: failed(ctx, requested, message, r) }) };
  }
  if (r?.requestedAt !== requested || r.phase !== 'Draining') {
    const draining: RestartStatus = { requestedAt: requested, phase: 'Draining', since: ctx.now() };
    ctx.log.info({ requestedAt: requested, providerID }, 'restart requested: draining before the restart');
    // Not on in this pass: every lease store must first see spec.drain, or a lease granted
    // meanwhile would point at a proxy about to stop.
    return {
      proxy: await writeStatus(ctx, p, { restart: draining }),
      result: { requeueAfter: ctx.options.drainPollMs },
    };
  }
  return drainThenRestart(ctx, provider, p, want, r, providerID);
}

function failed(
  ctx: ReconcileContext,
  requestedAt: string,
  message: string,
  r: RestartStatus | undefined,
): RestartStatus {
  return {
    requestedAt,
    phase: 'Failed',
    since: ctx.now(),
    ...(r?.previousAddress ? { previousAddress: r.previousAddress } : {}),
    message,
  };
}

/** Draining: on to Restarting once the live leases ended or the drain timed out. */
async function drainThenRestart(
  ctx: ReconcileContext,
  provider: Provider,
  p: ProxyObject,
  want: Wanted,
  r: RestartStatus,
  providerID: string,
): Promise<RestartStep> {
  const since = Date.parse(r.since);
  const left = (Number.isNaN(since) ? ctx.nowMs() : since) + ctx.options.drainTimeoutMs - ctx.nowMs();
  const leases = ctx.leasesOn(keyOf(p), providerID);
  if (leases > 0 && left > 0) {
    return { proxy: p, result: { requeueAfter: Math.min(ctx.options.drainPollMs, left) } };
  }
  if (leases > 0) ctx.log.warn({ providerID, leases }, 'drain timeout reached; restarting under live leases');
  const restarting: RestartStatus = {
    requestedAt: r.requestedAt,
    phase: 'Restarting',
    since: ctx.now(),
    ...(p.status?.address ? { previousAddress: p.status.address } : {}),
  };
  const name = p.status?.instanceName ?? providerID;
  const proxy = await writeStatus(ctx, p, {
    phase: 'Restarting',
    address: null,
    port: null,
    url: null,
    restart: restarting,
    message: `restarting ${name} for a new IP`,
    provisioned: {
      status: 'False',
      reason: PROVISIONED_REASONS.restarting,
      message: `restarting ${name} for a new IP`,
    },
  });
  return restartNow(ctx, provider, proxy, want, restarting, providerID);
}

/** Restarting: one provider call; Ready at the new address once it runs again. */
async function restartNow(
  ctx: ReconcileContext,
  provider: Provider,
  p: ProxyObject,
  want: Wanted,
  r: RestartStatus,
  providerID: string,
): Promise<RestartStep> {
  if (!canRestart(provider)) {
    const message = `provider "${provider.name}" (type ${provider.type}) cannot restart an instance for a new IP`;
    return { proxy: await writeStatus(ctx, p, { restart: failed(ctx, r.requestedAt, message, r) }) };
  }
  const since = new Date(Date.parse(r.since) || ctx.nowMs());
  let inst: Awaited<ReturnType<typeof provider.restart>>;
  try {
    inst = await provider.restart(ctx.call, providerID, since);
  } catch (err) {
    const cls = classify(err);
    if (
      !(err instanceof ProviderError) ||
      ctx.signal.aborted ||
      (cls !== 'Permanent' && cls !== 'NotFound')
    ) {
      throw err; // transient, quota: the queue retries the same restart
    }
    const message = `restart failed: ${errorMessage(err)}`;
    ctx.log.warn(
      { providerID, errorClass: cls, message },
      'restart failed; the instance is followed as usual',
    );
    return { proxy: await writeStatus(ctx, p, { restart: failed(ctx, r.requestedAt, message, r) }) };
  }
  const name = want.request.name;
  if (instanceVerdict(inst) !== 'ready') {
    const message = `restarting ${p.status?.instanceName ?? name} for a new IP (${inst.state})`;
    return { proxy: await writeStatus(ctx, p, { message }), result: provisionPoll(ctx) };
  }
  const done: RestartStatus = {
    requestedAt: r.requestedAt,
    phase: 'Done',
    since: r.since,
    ...(r.previousAddress ? { previousAddress: r.previousAddress } : {}),
    finishedAt: ctx.now(),
  };
  ctx.log.info(
    { providerID, address: inst.address, previousAddress: r.previousAddress },
    'instance restarted with a new IP; leased again once its health checks pass',
  );
  // The same instance: its name and the credentials its cloud-init serves stay.
  const proxy = await writeStatus(ctx, p, {
    ...readyIntent(p, inst, p.status?.instanceName ?? name, p.status?.credentialsGeneration),
    restart: done,
  });
  return { proxy, result: readyRequeue(ctx) };
}
