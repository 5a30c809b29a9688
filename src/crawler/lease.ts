/**
 * crawler/lease — the lease helpers a crawler wants around DiscoveryClient, the TypeScript twins
 * of clients/python's LeaseClient conveniences (docs/lease-api.md): calls retried with capped backoff
 * while the API cannot be reached (an operator restart, `503 no_leader`), a lease that waits
 * for a proxy until the `retryAt` a 409 announces, and `withLease`, which always ends its lease.
 */

import type { LeaseParams, ReportParams } from '../discovery/client.ts';
import { type DiscoveryClient, DiscoveryError, NoneLeasableError } from '../discovery/client.ts';
import type { LeaseGrant, ReportResult } from '../lease/types.ts';

export interface RetryOptions {
  /** How long to keep retrying an unreachable API, ms; default 60 s (0 = one attempt). */
  retryForMs?: number;
  /** Injected for tests. */
  sleep?: (ms: number) => Promise<void>;
  now?: () => number;
}

const realSleep = (ms: number) => new Promise<void>((ok) => setTimeout(ok, ms));

/** 250 ms, doubling, at most 5 s: the waits between retries of the API. */
export function* backoffDelays(firstMs = 250, capMs = 5000): Generator<number> {
  let d = firstMs;
  for (;;) {
    yield d;
    d = Math.min(capMs, d * 2);
  }
}

/** No answer (refused, reset, timed out), or one that says to come back (502, 503, 504). */
export function isUnreachable(err: unknown): boolean {
  if (err instanceof DiscoveryError) return err.status === 502 || err.status === 503 || err.status === 504;
  if (err instanceof Error)
    return err.name === 'TimeoutError' || (err instanceof TypeError && /fetch failed/.test(err.message));
  return false;
}

/** `fn()`, retried with backoff while the API is unreachable, for up to `retryForMs`. */
export async function retrying<T>(fn: () => Promise<T>, opts: RetryOptions = {}): Promise<T> {
  const now = opts.now ?? Date.now;
  const sleep = opts.sleep ?? realSleep;
  const deadline = now() + (opts.retryForMs ?? 60_000);
  const delays = backoffDelays();
  for (;;) {
    try {
      return await fn();
    } catch (err) {
      const delay = delays.next().value as number;
      if (!isUnreachable(err) || now() + delay > deadline) throw err;
      await sleep(delay);
    }
  }
}

export interface WaitOptions extends RetryOptions {
  /** How long to wait for a proxy when none is leasable, ms, following `retryAt`; default 0. */
  waitMs?: number;
}

type LeaseCalls = Pick<DiscoveryClient, 'lease' | 'release' | 'report'>;

/** A lease, asked again at the `retryAt` of each 409 while that is within `waitMs`; the last 409 otherwise. */
export async function leaseWaiting(
  client: Pick<DiscoveryClient, 'lease'>,
  params: LeaseParams,
  opts: WaitOptions = {},
): Promise<LeaseGrant> {
  const now = opts.now ?? Date.now;
  const sleep = opts.sleep ?? realSleep;
  const deadline = now() + (opts.waitMs ?? 0);
  for (;;) {
    try {
      return await retrying(() => client.lease(params), opts);
    } catch (err) {
      if (!(err instanceof NoneLeasableError) || err.retryAt === null) throw err;
      const delay = Math.max(50, Date.parse(err.retryAt) - now());
      if (now() + delay > deadline) throw err;
      await sleep(delay);
    }
  }
}

/** The lease inside `withLease`: report once; whatever happens, the lease ends with the block. */
export interface HeldLease {
  readonly grant: LeaseGrant;
  /** Reports (releasing the lease unless `release: false`); retried while the API is unreachable. */
  report(result: ReportResult, params?: Omit<ReportParams, 'result'>): Promise<void>;
  /** Whether a report released it already. */
  readonly ended: boolean;
}

/**
 * Leases (waiting up to `waitMs` for a proxy), runs `fn`, and releases the lease when `fn` ends —
 * returned or thrown — unless a report inside released it already. A failed release after `fn`
 * threw does not hide `fn`'s error (the lease then ends at its TTL).
 */
export async function withLease<T>(
  client: LeaseCalls,
  params: LeaseParams,
  fn: (lease: HeldLease) => Promise<T>,
  opts: WaitOptions = {},
): Promise<T> {
  const grant = await leaseWaiting(client, params, opts);
  let ended = false;
  const lease: HeldLease = {
    grant,
    get ended() {
      return ended;
    },
    async report(result, more = {}) {
      await retrying(() => client.report(grant.id, { result, ...more }), opts);
      if (more.release !== false) ended = true;
    },
  };
  let result: T;
  try {
    result = await fn(lease);
  } catch (err) {
    if (!ended) await retrying(() => client.release(grant.id), opts).catch(() => undefined);
    throw err;
  }
  if (!ended) await retrying(() => client.release(grant.id), opts);
  return result;
}
