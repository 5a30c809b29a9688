/**
 * orphans/sweeper — the orphan sweep (leader only): periodically lists every provider's managed
 * instances and deletes those no Proxy owns any more. The last line of defence against leaked
 * cloud VMs after crashes, manual edits or a finalizer that was removed by hand. It touches only
 * its own installation's instances (provider/installation): another operator's are skipped,
 * unlabelled ones of our Proxies are adopted, unlabelled ones of nobody we know are reported.
 */
import { SpanStatusCode, type Tracer, trace } from '@opentelemetry/api';
import type { Counter, Registry } from 'prom-client';
import type { ProxyObject } from '../api/proxy.ts';
import { errorMessage } from '../log/errors.ts';
import { type Logger, silentLogger } from '../log/index.ts';
import { counter } from '../metrics/register.ts';
import type { CallContext, Instance, Provider } from '../provider/contract.ts';
import { claimOf } from '../provider/installation.ts';
import { type Clock, sleep, systemClock } from '../runtime/clock.ts';
import type { ObjectStore } from '../runtime/store.ts';

export interface GCOptions {
  store: ObjectStore;
  /** Decorated providers by name. */
  providers: () => Iterable<[string, Provider]>;
  /** Time between sweeps; 0 turns GC off (`--gc-interval 0`). */
  intervalMs: number;
  minAgeMs: number;
  /** With --proxy-namespace, only instances labelled with this namespace are considered. */
  proxyNamespace?: string;
  /** This operator's installation id: only instances labelled with it are ever collected. */
  installation: string;
  log?: Logger;
  registry?: Registry;
  clock?: Clock;
  tracer?: Tracer;
}

export interface SweepResult {
  deleted: Record<string, string[]>;
  failed: Record<string, string>;
  /** Unlabelled instances of our Proxies that were labelled with our installation id now. */
  adopted: Record<string, string[]>;
  /** Unlabelled instances no Proxy of ours owns: left alone, reported (someone else's, or a leak). */
  unclaimed: Record<string, string[]>;
}

/** What the sweep knows about the Proxies in scope, computed once per sweep. */
interface Owners {
  uids: Set<string>;
  retiring: Set<string>;
}

function ownersOf(proxies: ProxyObject[]): Owners {
  const uids = new Set<string>();
  const retiring = new Set<string>();
  for (const p of proxies) {
    if (p.metadata.uid) uids.add(p.metadata.uid);
    for (const id of p.status?.retiring ?? []) retiring.add(id);
    // The current instance is owned through the UID, but a providerID in status is also
    // protected explicitly, in case a backend reads back a different UID label.
    if (p.status?.providerID) retiring.add(p.status.providerID);
  }
  return { uids, retiring };
}

/**
 * Whose instance this is: our installation's (labelled, or unlabelled but recorded or
 * UID-owned by one of our Proxies), another installation's, or nobody's we know.
 */
function claim(inst: Instance, installation: string, owners: Owners): 'ours' | 'foreign' | 'unclaimed' {
  const c = claimOf(inst, installation, owners.uids);
  return c === 'unclaimed' && owners.retiring.has(inst.id) ? 'ours' : c;
}

/** Pure decision: may this instance (of our installation) be deleted as an orphan? */
function orphanVerdict(
  inst: Instance,
  owners: Owners,
  now: number,
  minAgeMs: number,
  proxyNamespace?: string,
): { orphan: true } | { orphan: false; keep: string } {
  if (!inst.uid) return { orphan: false, keep: 'no owner UID label' };
  if (owners.uids.has(inst.uid)) return { orphan: false, keep: 'owned by a Proxy' };
  if (owners.retiring.has(inst.id)) return { orphan: false, keep: 'retiring or current instance of a Proxy' };
  if (proxyNamespace !== undefined && inst.namespace !== proxyNamespace) {
    return { orphan: false, keep: 'outside --proxy-namespace' };
  }
  if (!inst.createdAt) return { orphan: false, keep: 'creation time unknown' };
  if (now - inst.createdAt.getTime() < minAgeMs) return { orphan: false, keep: 'younger than --gc-min-age' };
  return { orphan: true };
}

export class OrphanSweeper {
  private readonly opts: GCOptions;
  private readonly log: Logger;
  private readonly clock: Clock;
  private readonly tracer: Tracer;
  private readonly deletedTotal: Counter<'provider'> | undefined;
  /** Unclaimed instances already reported, so each is warned about once per process. */
  private readonly reported = new Set<string>();

  constructor(opts: GCOptions) {
    this.opts = opts;
    this.log = opts.log ?? silentLogger();
    this.clock = opts.clock ?? systemClock;
    this.tracer = opts.tracer ?? trace.getTracer('egress-proxies-operator');
    this.deletedTotal = opts.registry
      ? counter(opts.registry, {
          name: 'proxy_operator_gc_deleted_total',
          help: 'Orphaned instances deleted by the garbage collector.',
          labelNames: ['provider'],
        })
      : undefined;
  }

  /** One pass over every provider; a failing provider is skipped, never aborting the others. */
  async sweep(signal: AbortSignal): Promise<SweepResult> {
    return this.tracer.startActiveSpan('gc.sweep', async (span) => {
      const result: SweepResult = { deleted: {}, failed: {}, adopted: {}, unclaimed: {} };
      try {
        await this.opts.store.proxies.synced(signal);
        const owners = ownersOf(this.opts.store.proxies.list());
        const ctx = { signal, log: this.log };
        await Promise.all(
          [...this.opts.providers()].map(async ([name, provider]) => {
            let instances: Instance[];
            try {
              instances = await provider.listByTag(ctx);
            } catch (err) {
              result.failed[name] = errorMessage(err);
              this.log.warn(
                { provider: name, err },
                'gc: listing instances failed; skipping provider this sweep',
              );
              return;
            }
            const now = this.clock.now();
            for (const inst of instances) {
              if (signal.aborted) return;
              const whose = claim(inst, this.opts.installation, owners);
              if (whose === 'foreign') continue;
              if (whose === 'unclaimed') {
                this.report(name, inst, result);
                continue;
              }
              if (inst.installation === undefined) await this.adopt(ctx, name, provider, inst, result);
              const verdict = orphanVerdict(inst, owners, now, this.opts.minAgeMs, this.opts.proxyNamespace);
              if (!verdict.orphan) continue;
              try {
                await provider.delete(ctx, inst.id);
                result.deleted[name] = [...(result.deleted[name] ?? []), inst.id];
                this.deletedTotal?.inc({ provider: name });
                this.log.info(
                  { provider: name, providerID: inst.id, uid: inst.uid },
                  'gc: deleted orphaned instance',
                );
              } catch (err) {
                result.failed[name] = errorMessage(err);
                this.log.warn({ provider: name, providerID: inst.id, err }, 'gc: delete failed');
              }
            }
          }),
        );
        span.setAttribute('gc.deleted', Object.values(result.deleted).flat().length);
        return result;
      } catch (err) {
        span.setStatus({ code: SpanStatusCode.ERROR, message: errorMessage(err) });
        throw err;
      } finally {
        span.end();
      }
    });
  }

  /**
   * An unlabelled instance of one of our Proxies (created before installations existed) gets
   * our label, so another installation's GC will never take it for an orphan of its own. A
   * backend that cannot relabel keeps it unlabelled: we still recognise it by the Proxy UID.
   */
  private async adopt(
    ctx: CallContext,
    name: string,
    provider: Provider,
    inst: Instance,
    result: SweepResult,
  ): Promise<void> {
    if (!provider.adopt) return;
    try {
      await provider.adopt(ctx, inst.id, this.opts.installation);
      result.adopted[name] = [...(result.adopted[name] ?? []), inst.id];
      this.log.info(
        { provider: name, providerID: inst.id, uid: inst.uid },
        'gc: labelled an instance of ours with the installation id',
      );
    } catch (err) {
      this.log.warn({ provider: name, providerID: inst.id, err }, 'gc: labelling an instance of ours failed');
    }
  }

  /** Unlabelled and not ours: never deleted, warned about once (it may be another operator's). */
  private report(name: string, inst: Instance, result: SweepResult): void {
    result.unclaimed[name] = [...(result.unclaimed[name] ?? []), inst.id];
    const key = `${name}\u0000${inst.id}`;
    if (this.reported.has(key)) return;
    this.reported.add(key);
    this.log.warn(
      { provider: name, providerID: inst.id, uid: inst.uid },
      'gc: instance without an installation label belongs to no Proxy of ours; left alone (delete it by hand if it is a leak)',
    );
  }

  /** Runnable: sweep every interval until the signal aborts; interval 0 means GC is off. */
  async start(signal: AbortSignal): Promise<void> {
    if (this.opts.intervalMs <= 0) {
      // Off, not failed: stay up like any other runnable so the manager does not see an exit.
      this.log.info('gc: off (--gc-interval 0); orphaned instances are not collected');
      if (!signal.aborted) await new Promise((r) => signal.addEventListener('abort', r, { once: true }));
      return;
    }
    while (!signal.aborted) {
      try {
        await this.sweep(signal);
      } catch (err) {
        if (signal.aborted) return;
        this.log.warn({ err }, 'gc: sweep failed');
      }
      try {
        await sleep(this.opts.intervalMs, signal, this.clock);
      } catch {
        return;
      }
    }
  }
}
