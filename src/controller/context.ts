/**
 * controller/context — what every step of one reconcile shares: the Proxy key, cancellation,
 * logger, store, credentials resolver and tuning. Steps are module-level functions over it, so
 * each reads on its own and the state machine (controller/reconciler) stays a table.
 */

import type { ObjectKey } from '../api/meta.ts';
import type { Logger } from '../log/index.ts';
import type { CallContext, Provider } from '../provider/contract.ts';
import type { CredentialsResolver } from '../runtime/credentials.ts';
import type { ObjectStore } from '../runtime/store.ts';
import type { SurgeLimiter } from './surge.ts';

export interface ProviderLookup {
  get(name: string): Provider | undefined;
}

export interface ReconcilerOptions {
  /** Poll interval while an instance is starting (default 10 s). */
  provisionPollMs?: number;
  /** Poll interval while an instance is being deleted (default 5 s). */
  deletionPollMs?: number;
  /** Fixed retry delay after QuotaExceeded (default 5 min). */
  quotaBackoffMs?: number;
  /** Re-check of a Ready instance, to notice one lost behind our back (default 10 min; 0 = never). */
  readyResyncMs?: number;
  /** Writes of one status patch that keeps hitting Conflict, the first included (default 5). */
  conflictRetries?: number;
  /**
   * Switch to a replacement only once the health engine passed it (status.replacementHealth;
   * default true). Off only in tests of the reconciler alone, where no engine runs.
   */
  healthGate?: boolean;
  /** Longest a replaced instance drains (keeps its leases, gets no new ones) before deletion (default 10 min). */
  drainTimeoutMs?: number;
  /** Poll interval while an instance drains (default 5 s). */
  drainPollMs?: number;
}

export function resolveOptions(o: ReconcilerOptions = {}): Required<ReconcilerOptions> {
  return {
    provisionPollMs: o.provisionPollMs ?? 10_000,
    deletionPollMs: o.deletionPollMs ?? 5_000,
    quotaBackoffMs: o.quotaBackoffMs ?? 300_000,
    readyResyncMs: o.readyResyncMs ?? 600_000,
    conflictRetries: o.conflictRetries ?? 5,
    healthGate: o.healthGate ?? true,
    drainTimeoutMs: o.drainTimeoutMs ?? 600_000,
    drainPollMs: o.drainPollMs ?? 5_000,
  };
}

export interface ReconcileResult {
  requeueAfter?: number;
}

/** Per-reconcile state and the shared dependencies the steps use. */
export interface ReconcileContext {
  readonly key: ObjectKey;
  readonly signal: AbortSignal;
  readonly log: Logger;
  /** Handed to provider calls: the same signal and logger. */
  readonly call: CallContext;
  readonly store: ObjectStore;
  readonly providers: ProviderLookup;
  readonly credentials: CredentialsResolver;
  /** This operator's installation id: stamped on instances, the key of the spec-hash HMAC. */
  readonly installation: string;
  readonly options: Required<ReconcilerOptions>;
  /** Now, as an RFC 3339 timestamp for conditions. */
  now(): string;
  /** Now, clock milliseconds. */
  nowMs(): number;
  /** Per-provider replacement slots. */
  readonly surge: SurgeLimiter;
  /** Live leases granted on instance `providerID` of Proxy `key` (this process's lease store). */
  leasesOn(key: string, providerID: string): number;
  /** Counts an instance that vanished or died while its Proxy expected it. */
  countLost(provider: string): void;
}

/** A failed reconcile that the work queue retries with backoff. */
export class ReconcileError extends Error {
  constructor(message: string, opts: { cause?: unknown } = {}) {
    super(message, opts.cause === undefined ? undefined : { cause: opts.cause });
    this.name = 'ReconcileError';
  }
}

/** The periodic re-check of a Ready proxy, when enabled. */
export function readyRequeue(ctx: ReconcileContext): ReconcileResult {
  return ctx.options.readyResyncMs > 0 ? { requeueAfter: ctx.options.readyResyncMs } : {};
}

/** Poll a starting instance. */
export function provisionPoll(ctx: ReconcileContext): ReconcileResult {
  return { requeueAfter: ctx.options.provisionPollMs };
}
