/**
 * provider/gcp/restart — a new external IP for a running VM without a new VM (pool rotation
 * `strategy: Restart`, see docs/providers/gcp.md): stop it (GCE releases its ephemeral external
 * IP), then start it (GCE assigns a new one). Both are zone operations, followed to their end
 * like inserts and deletes (provider/gcp/operations): waited for a bounded time, remembered
 * when still running and checked on the next call, never sent twice while GCE works on them,
 * and an operation's error is thrown with GCE's code.
 *
 * One restart is named by its `since` (when the caller decided it). The instance counts as
 * restarted once it runs again after a stop this process followed to its end, or — after an
 * operator restart, when that memory is gone — after a stop GCE dates at or after `since`
 * (GCE's clock against the operator's: a skew larger than the time between deciding and
 * stopping costs one more stop/start, never a missed one).
 */
import type { CallContext, Instance } from '../contract.ts';
import { notFound, permanent } from '../errors.ts';
import type { Clients } from './clients.ts';
import { parseError, raceSignal, toProviderError, type Where } from './errors.ts';
import { type GceInstance, type GcpRef, instanceFromGce, lastSegment, providerIDOf } from './instance.ts';
import type { GceOperation, OperationFollower } from './operations.ts';

export interface RestarterDeps {
  provider: string;
  ops: OperationFollower;
  callOpts: () => { retry: null; timeout: number };
  log: { info(obj: object, msg: string): void };
}

/** A restart this process started, by providerID: which `since`, and whether its start ended. */
interface Started {
  since: number;
  started: boolean;
}

export class Restarter {
  private readonly d: RestarterDeps;
  private readonly started = new Map<string, Started>();

  constructor(d: RestarterDeps) {
    this.d = d;
  }

  async restart(ctx: CallContext, c: Clients, ref: GcpRef, since: Date): Promise<Instance> {
    const id = providerIDOf(ref);
    const where: Where = { op: 'restart', provider: this.d.provider, providerID: id };
    const sinceMs = since.getTime();
    if (Number.isNaN(sinceMs)) throw permanent(`${this.d.provider} restart ${id}: invalid since`, where);
    let mine = this.started.get(id);
    if (mine && mine.since !== sinceMs) {
      this.started.delete(id); // another restart now
      mine = undefined;
    }
    // A stop or start GCE is still working on is followed, not sent again; a failed one is
    // reported once, and the next call looks at the instance afresh.
    const followed = await this.d.ops.check(ctx, c, id, where);
    if (followed && (followed.rec.kind === 'stop' || followed.rec.kind === 'start')) {
      if (followed.state === 'running') return this.read(ctx, c, ref, where);
      this.d.ops.forget(id);
      if (followed.state === 'failed') throw followed.failure;
      if (followed.rec.kind === 'start' && mine) mine.started = true;
    }
    const inst = await this.readRaw(ctx, c, ref, where);
    switch (inst.status) {
      case 'RUNNING': {
        if (mine?.started || stoppedSince(inst, sinceMs)) {
          const out = this.toInstance(inst, ref);
          // Over once it serves (RUNNING without its new IP yet is still starting).
          if (out.state === 'Running') this.started.delete(id);
          return out;
        }
        const stopped = await this.send(ctx, c, ref, 'stop', where);
        if (stopped === 'running') return this.read(ctx, c, ref, where);
        return this.start(ctx, c, ref, sinceMs, where);
      }
      case 'TERMINATED':
      case 'STOPPED':
        return this.start(ctx, c, ref, sinceMs, where);
      case 'SUSPENDED':
        throw permanent(
          `${this.d.provider} restart ${id}: the instance is suspended; resume it or delete the Proxy`,
          where,
        );
      default:
        // PROVISIONING, STAGING (starting), STOPPING, SUSPENDING, REPAIRING: GCE is at it.
        return this.toInstance(inst, ref);
    }
  }

  private async start(
    ctx: CallContext,
    c: Clients,
    ref: GcpRef,
    sinceMs: number,
    where: Where,
  ): Promise<Instance> {
    const id = providerIDOf(ref);
    this.started.set(id, { since: sinceMs, started: false });
    const state = await this.send(ctx, c, ref, 'start', where);
    if (state === 'done') {
      const mine = this.started.get(id);
      if (mine) mine.started = true;
    }
    const inst = await this.read(ctx, c, ref, where);
    // Done and running: this restart is over, whatever is asked next is another one.
    if (state === 'done' && inst.state === 'Running') this.started.delete(id);
    return inst;
  }

  /** Sends a stop or start and follows its operation; 'running' when GCE is still at it. */
  private async send(
    ctx: CallContext,
    c: Clients,
    ref: GcpRef,
    kind: 'stop' | 'start',
    where: Where,
  ): Promise<'done' | 'running'> {
    const args = { project: ref.project, zone: ref.zone, instance: ref.name };
    try {
      const [accepted] = await raceSignal(
        () =>
          kind === 'stop'
            ? c.instances.stop(args, this.d.callOpts())
            : c.instances.start(args, this.d.callOpts()),
        ctx.signal,
      );
      this.d.log.info({ instance: ref.name, zone: ref.zone }, `gcp instance ${kind} accepted`);
      const op = (accepted as { latestResponse?: GceOperation } | undefined)?.latestResponse;
      return await this.d.ops.settle(ctx, c, op, { kind, ref }, where);
    } catch (err) {
      if (parseError(err).http === 404) {
        throw notFound(`${this.d.provider} restart ${providerIDOf(ref)}: instance not found`, where);
      }
      throw toProviderError(err, where, ctx.signal);
    }
  }

  private async readRaw(ctx: CallContext, c: Clients, ref: GcpRef, where: Where): Promise<GceInstance> {
    try {
      const [inst] = await raceSignal(
        () =>
          c.instances.get({ project: ref.project, zone: ref.zone, instance: ref.name }, this.d.callOpts()),
        ctx.signal,
      );
      return inst as GceInstance;
    } catch (err) {
      if (parseError(err).http === 404) {
        throw notFound(`${this.d.provider} restart ${providerIDOf(ref)}: instance not found`, where);
      }
      throw toProviderError(err, where, ctx.signal);
    }
  }

  private async read(ctx: CallContext, c: Clients, ref: GcpRef, where: Where): Promise<Instance> {
    return this.toInstance(await this.readRaw(ctx, c, ref, where), ref);
  }

  private toInstance(inst: GceInstance, ref: GcpRef): Instance {
    return instanceFromGce(inst, ref.project, lastSegment(inst.zone) || ref.zone);
  }
}

/** GCE stopped the instance at or after `sinceMs` (its lastStopTimestamp, GCE's clock). */
function stoppedSince(inst: GceInstance, sinceMs: number): boolean {
  const at = Date.parse(inst.lastStopTimestamp ?? '');
  return !Number.isNaN(at) && at >= sinceMs;
}
