/**
 * controller/provision — bring the desired instance up and keep it up: create it when none is
 * recorded, bring a replacement up before switching to it when the spec-hash changed, and
 * follow the recorded one (ready, starting, lost, dead). Status goes through the writer.
 */
import type { ProxyObject } from '../api/proxy.ts';
import type { CreateRequest, Instance, Provider } from '../provider/contract.ts';
import { classify } from '../provider/errors.ts';
import { provisionPoll, type ReconcileContext, type ReconcileResult, readyRequeue } from './context.ts';
import { lostIntent, provisioningIntent, readyIntent } from './status.ts';
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

/** The state table's instance rows: no providerID, a changed name, or the recorded instance. */
export function provisionOrReplace(
  ctx: ReconcileContext,
  provider: Provider,
  p: ProxyObject,
  req: CreateRequest,
): Promise<Acted> {
  const current = p.status?.providerID;
  if (!current) return createAndRecord(ctx, provider, p, req);
  if (p.status?.instanceName !== req.name) return replace(ctx, provider, p, req, current);
  return followInstance(ctx, provider, p, req, current);
}

async function createAndRecord(
  ctx: ReconcileContext,
  provider: Provider,
  p: ProxyObject,
  req: CreateRequest,
): Promise<Acted> {
  const inst = await provider.create(ctx.call, req);
  if (instanceVerdict(inst) === 'ready') {
    return { proxy: await writeStatus(ctx, p, readyIntent(p, inst, req.name)), result: readyRequeue(ctx) };
  }
  return { proxy: await writeStatus(ctx, p, provisioningIntent(inst, req.name)), result: provisionPoll(ctx) };
}

/** Spec changed: bring the new instance up first, then switch, then retire the old one. */
async function replace(
  ctx: ReconcileContext,
  provider: Provider,
  p: ProxyObject,
  req: CreateRequest,
  current: string,
): Promise<Acted> {
  const inst = await provider.create(ctx.call, req);
  const verdict = instanceVerdict(inst);
  if (verdict === 'lost') {
    // A dead instance already holds the new name: clear it so the next create starts fresh.
    ctx.log.warn({ providerID: inst.id, state: inst.state }, 'replacement instance is dead; deleting it');
    await provider.delete(ctx.call, inst.id);
  }
  if (verdict !== 'ready') {
    const proxy = await writeStatus(ctx, p, {
      phase: 'Replacing',
      message: `replacing ${p.status?.instanceName ?? current} with ${req.name} (${inst.state})`,
    });
    return { proxy, result: provisionPoll(ctx) };
  }
  const retiring = [...(p.status?.retiring ?? []), ...(current === inst.id ? [] : [current])];
  const proxy = await writeStatus(ctx, p, { ...readyIntent(p, inst, req.name), retiring });
  return { proxy, result: readyRequeue(ctx) };
}

/** The recorded instance: ready, still starting, gone (recreate) or dead (delete, then recreate). */
async function followInstance(
  ctx: ReconcileContext,
  provider: Provider,
  p: ProxyObject,
  req: CreateRequest,
  current: string,
): Promise<Acted> {
  let inst: Instance;
  try {
    inst = await provider.get(ctx.call, current);
  } catch (err) {
    if (classify(err) !== 'NotFound') throw err;
    ctx.countLost(provider.name);
    ctx.log.warn({ providerID: current }, 'instance lost; creating a new one');
    return createAndRecord(ctx, provider, p, req);
  }
  const verdict = instanceVerdict(inst);
  if (verdict === 'ready') {
    return { proxy: await writeStatus(ctx, p, readyIntent(p, inst, req.name)), result: readyRequeue(ctx) };
  }
  if (verdict === 'pending') {
    return {
      proxy: await writeStatus(ctx, p, provisioningIntent(inst, req.name)),
      result: provisionPoll(ctx),
    };
  }
  // Stopped or terminated for good: delete it; once get says NotFound the lost path recreates
  // it under the same name (creating first would just re-find the dead one).
  ctx.log.warn({ providerID: current, state: inst.state }, 'instance terminated; deleting it to recreate');
  await provider.delete(ctx.call, current);
  return { proxy: await writeStatus(ctx, p, lostIntent(inst)), result: provisionPoll(ctx) };
}
