/**
 * controller/provision — bring the desired instance up and keep it up: create it when none is
 * recorded; on a spec-hash change, bring a replacement up beside the serving instance (within
 * the provider's replacement slots), record it as `status.pending` and switch to it only once
 * the health engine has passed it (`status.replacementHealth`), moving the old one to
 * `status.draining`; and follow the recorded instance (ready, starting, lost, dead).
 * Status goes through the writer.
 */
import { DEFAULT_PROXY_PORT } from '../api/constants.ts';
import { keyOf } from '../api/meta.ts';
import { type DrainingInstance, type PendingInstance, type ProxyObject, phaseServes } from '../api/proxy.ts';
import type { CreateRequest, Instance, Provider } from '../provider/contract.ts';
import { classify, ProviderError } from '../provider/errors.ts';
import { provisionPoll, type ReconcileContext, type ReconcileResult, readyRequeue } from './context.ts';
import { dropUnusedGenerations } from './generations.ts';
import { lostIntent, provisioningIntent, readyIntent, type StatusIntent } from './status.ts';
import { writeStatus } from './writer.ts';

/** How the reconciler reads an instance the provider returned. */
export type InstanceVerdict = 'ready' | 'pending' | 'lost';

/** Running with an address serves; Stopping/Stopped/Terminated never will again; the rest may. */
export function instanceVerdict(inst: Instance): InstanceVerdict {
  if (inst.state === 'Running' && inst.address) return 'ready';
  if (inst.state === 'Stopping' || inst.state === 'Stopped' || inst.state === 'Terminated') return 'lost';
  return 'pending';
}

export interface Acted {
  proxy: ProxyObject;
  result: ReconcileResult;
}

/** What to run: the create request and the credentials generation it serves. */
export interface Wanted {
  request: CreateRequest;
  generation: number;
}

/** The state table's instance rows: no providerID, a changed name, or the recorded instance. */
export function provisionOrReplace(
  ctx: ReconcileContext,
  provider: Provider,
  p: ProxyObject,
  want: Wanted,
): Promise<Acted> {
  const current = p.status?.providerID;
  if (!current) return createAndRecord(ctx, provider, p, want);
  if (p.status?.instanceName !== want.request.name) return replace(ctx, provider, p, want, current);
  return followInstance(ctx, provider, p, want, current);
}

async function createAndRecord(
  ctx: ReconcileContext,
  provider: Provider,
  p: ProxyObject,
  { request: req, generation }: Wanted,
): Promise<Acted> {
  const inst = await provider.create(ctx.call, req);
  if (instanceVerdict(inst) === 'ready') {
    return {
      proxy: await writeStatus(ctx, p, readyIntent(p, inst, req.name, generation)),
      result: readyRequeue(ctx),
    };
  }
  return {
    proxy: await writeStatus(ctx, p, provisioningIntent(inst, req.name, generation)),
    result: provisionPoll(ctx),
  };
}

/** Drops a recorded replacement that is no longer wanted: it goes to `retiring`. */
async function abandonPending(ctx: ReconcileContext, p: ProxyObject, why: string): Promise<ProxyObject> {
  const pending = p.status?.pending;
  if (!pending) return p;
  ctx.log.info({ providerID: pending.providerID, why }, 'abandoning the replacement instance');
  const proxy = await writeStatus(ctx, p, {
    pending: null,
    retiring: [...(p.status?.retiring ?? []), pending.providerID],
  });
  await dropUnusedGenerations(ctx, proxy, [pending.credentialsGeneration]);
  return proxy;
}

/** Whether the health engine has passed `providerID` (always, with the gate off). */
function passed(ctx: ReconcileContext, p: ProxyObject, providerID: string): boolean {
  if (!ctx.options.healthGate) return true;
  const rh = p.status?.replacementHealth;
  return rh?.providerID === providerID && rh.healthy;
}

/**
 * Spec changed: take a replacement slot, bring the new instance up beside the serving one,
 * wait for the health engine to pass it, then switch in one status write (the old instance
 * goes to `draining`, or straight to `retiring` when it was not serving).
 */
async function replace(
  ctx: ReconcileContext,
  provider: Provider,
  p0: ProxyObject,
  { request: req, generation }: Wanted,
  current: string,
): Promise<Acted> {
  const key = keyOf(p0);
  let p = p0;
  if (p.status?.pending && p.status.pending.instanceName !== req.name) {
    p = await abandonPending(ctx, p, 'the spec changed again');
  }
  if (p.status?.pending) ctx.surge.hold(provider.name, key);
  else {
    const slot = ctx.surge.tryAcquire(provider.name, key);
    if (!slot.granted) {
      const message = `waiting for a replacement slot (${slot.inUse} of ${slot.limit} replacing on provider "${provider.name}")`;
      return { proxy: await writeStatus(ctx, p, { message }), result: provisionPoll(ctx) };
    }
  }
  const inst = await provider.create(ctx.call, req);
  const verdict = instanceVerdict(inst);
  if (verdict === 'lost') {
    // A dead instance already holds the new name: clear it so the next create starts fresh.
    ctx.log.warn({ providerID: inst.id, state: inst.state }, 'replacement instance is dead; deleting it');
    await provider.delete(ctx.call, inst.id);
  }
  const pending: PendingInstance = {
    providerID: inst.id,
    instanceName: req.name,
    credentialsGeneration: generation,
  };
  if (verdict === 'ready' && inst.address) {
    pending.address = inst.address;
    pending.port = inst.port ?? p.spec.port ?? DEFAULT_PROXY_PORT;
  }
  const from = p.status?.instanceName ?? current;
  if (verdict !== 'ready' || !passed(ctx, p, inst.id)) {
    const intent: StatusIntent = {
      phase: 'Replacing',
      pending: verdict === 'lost' ? null : pending,
      message:
        verdict === 'ready'
          ? waitingForHealth(p, inst.id, req.name)
          : `replacing ${from} with ${req.name} (${inst.state})`,
    };
    return { proxy: await writeStatus(ctx, p, intent), result: provisionPoll(ctx) };
  }
  const proxy = await writeStatus(ctx, p, switchIntent(ctx, p, inst, req.name, generation, current));
  ctx.surge.release(provider.name, key);
  ctx.log.info({ providerID: inst.id, previousProviderID: current }, 'replacement passed its health checks');
  return { proxy, result: readyRequeue(ctx) };
}

function waitingForHealth(p: ProxyObject, providerID: string, name: string): string {
  const rh = p.status?.replacementHealth;
  const last =
    rh?.providerID === providerID && !rh.healthy && rh.lastError ? ` (last probe: ${rh.lastError})` : '';
  return `waiting for ${name} to pass its health checks${last}`;
}

/** The switch: the replacement serves; the old instance drains (or retires when it served nothing). */
function switchIntent(
  ctx: ReconcileContext,
  p: ProxyObject,
  inst: Instance,
  name: string,
  generation: number,
  current: string,
): StatusIntent {
  const s = p.status;
  const intent: StatusIntent = { ...readyIntent(p, inst, name, generation), pending: null };
  if (current === inst.id) return intent;
  if (phaseServes(s?.phase) && s?.address) {
    const d: DrainingInstance = { providerID: current, address: s.address, since: ctx.now() };
    if (s.port !== undefined) d.port = s.port;
    if (s.credentialsGeneration) d.credentialsGeneration = s.credentialsGeneration;
    intent.draining = [...(s.draining ?? []).filter((x) => x.providerID !== current), d];
  } else {
    intent.retiring = [...(s?.retiring ?? []), current];
  }
  return intent;
}

/** The recorded instance: ready, still starting, gone (recreate) or dead (delete, then recreate). */
async function followInstance(
  ctx: ReconcileContext,
  provider: Provider,
  p0: ProxyObject,
  want: Wanted,
  current: string,
): Promise<Acted> {
  const req = want.request;
  // The spec came back to the serving instance: a replacement in flight is not needed.
  const p = await abandonPending(ctx, p0, 'the spec is the serving instance again');
  ctx.surge.release(provider.name, keyOf(p));
  let inst: Instance;
  try {
    inst = await provider.get(ctx.call, current);
  } catch (err) {
    if (classify(err) !== 'NotFound') throw err;
    if (neverCreated(err)) {
      // The provider says the create itself failed (a cloud operation that ended in error after
      // it answered): not a lost instance, just a create to try again.
      ctx.log.warn({ providerID: current, err }, 'instance was never created; creating it again');
    } else {
      ctx.countLost(provider.name);
      ctx.log.warn({ providerID: current }, 'instance lost; creating a new one');
    }
    // Unserved first: every health engine and lease store forgets the lost instance's verdict,
    // so the re-created one starts from Unknown even when it reuses the address.
    const unserved = await writeStatus(
      ctx,
      p,
      lostIntent(`instance ${p.status?.instanceName ?? current} is gone`),
    );
    return createAndRecord(ctx, provider, unserved, want);
  }
  const verdict = instanceVerdict(inst);
  if (verdict === 'ready') {
    return {
      proxy: await writeStatus(ctx, p, readyIntent(p, inst, req.name, want.generation)),
      result: readyRequeue(ctx),
    };
  }
  if (verdict === 'pending') {
    return {
      proxy: await writeStatus(ctx, p, provisioningIntent(inst, req.name, want.generation)),
      result: provisionPoll(ctx),
    };
  }
  // Stopped or terminated for good: delete it; once get says NotFound the lost path recreates
  // it under the same name (creating first would just re-find the dead one).
  ctx.log.warn({ providerID: current, state: inst.state }, 'instance terminated; deleting it to recreate');
  await provider.delete(ctx.call, current);
  return {
    proxy: await writeStatus(ctx, p, lostIntent(`instance ${inst.name} is ${inst.state}`)),
    result: provisionPoll(ctx),
  };
}

/** A NotFound that the provider attributes to the create operation, not to the instance's loss. */
function neverCreated(err: unknown): boolean {
  return err instanceof ProviderError && err.op === 'create';
}
