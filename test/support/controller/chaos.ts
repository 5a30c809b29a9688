/**
 * test/support/controller/chaos — "kills" a reconciler at random for the crash-safety tests
 * (test/unit/controller/crash.test.ts with the fake provider, test/integration/provider/aws-crash
 * with the aws provider against moto): aborts the signal of the reconcile in flight, so nothing
 * after that point reaches the store or the provider — before an operation, or right after it
 * took effect and before its answer was used.
 */
import type { CallContext, Provider } from '../../../src/provider/contract.ts';
import type { ObjectStore } from '../../../src/runtime/store.ts';
import { seededRandom } from '../random.ts';

export class Chaos {
  rate = 0.1;
  kills = 0;
  private current: AbortController | undefined;
  private readonly rnd: () => number;
  constructor(seed: number) {
    this.rnd = seededRandom(seed);
  }
  begin(): AbortSignal {
    this.current = new AbortController();
    return this.current.signal;
  }
  maybeKill(): void {
    if (this.current && !this.current.signal.aborted && this.rnd() < this.rate) {
      this.kills++;
      this.current.abort(new Error('killed'));
      throw new Error('killed');
    }
  }
  wrapProvider(p: Provider): Provider {
    const around =
      <A extends unknown[], R>(fn: (ctx: CallContext, ...a: A) => Promise<R>) =>
      async (ctx: CallContext, ...a: A): Promise<R> => {
        this.maybeKill();
        const out = await fn.call(p, ctx, ...a);
        this.maybeKill(); // the backend did it; the answer never made it to the status
        return out;
      };
    return {
      name: p.name,
      type: p.type,
      create: around(p.create),
      get: around(p.get),
      delete: around(p.delete),
      listByTag: around(p.listByTag),
    };
  }
  wrapStore(s: ObjectStore): ObjectStore {
    const proxies = Object.create(s.proxies) as ObjectStore['proxies'];
    for (const m of ['patchStatus', 'update', 'removeFinalizer', 'addFinalizer'] as const) {
      const orig = (s.proxies[m] as (...a: unknown[]) => Promise<unknown>).bind(s.proxies);
      (proxies as unknown as Record<string, unknown>)[m] = async (...a: unknown[]) => {
        this.maybeKill();
        const out = await orig(...a);
        this.maybeKill();
        return out;
      };
    }
    return { ...s, proxies };
  }
}
