/**
 * provider/gcp/operations — follows Compute Engine zone operations to their end. An accepted
 * insert, delete, stop or start (the last two: provider/gcp/restart) is waited for (`zoneOperations.wait`) up to a bounded deadline; one still
 * running then is remembered per instance and checked (`zoneOperations.get`) on the next call
 * about that instance, so a write is never sent twice while GCE is still working on it; an
 * operation that ends in an error becomes a classified ProviderError with GCE's code and message.
 *
 * The memory is per process: after a restart an insert that failed meanwhile reads as a
 * missing instance again (the reconciler's lost path), which is the behaviour before this.
 */
import type { Logger } from 'pino';
import { type ErrorClass, notFound, ProviderError, redact } from '../errors.ts';
import type { Clients } from './clients.ts';
import {
  classForOperation,
  GcpApiError,
  parseError,
  raceSignal,
  toProviderError,
  type Where,
} from './errors.ts';
import { type GcpRef, providerIDOf } from './instance.ts';

/** The fields of a compute Operation we read. */
export interface GceOperation {
  name?: string | null;
  status?: string | number | null;
  error?: { errors?: Array<{ code?: string | null; message?: string | null }> | null } | null;
  httpErrorStatusCode?: number | null;
}

export type OperationKind = 'insert' | 'delete' | 'stop' | 'start';

/** The provider operation an operation kind belongs to, for error messages and metrics. */
export function providerOpOf(kind: OperationKind): string {
  if (kind === 'insert') return 'create';
  return kind === 'delete' ? 'delete' : 'restart';
}

/** A write GCE accepted and we have not seen end yet, or whose failure we still report. */
export interface Followed {
  kind: OperationKind;
  ref: GcpRef;
  operation: string;
  since: number;
  /** For an insert: the Proxy identity a synthesized Pending instance carries. */
  uid?: string;
  namespace?: string;
  /** The operation's error, once it ended in one. */
  failure?: ProviderError;
  /** The failure was thrown to a caller once; from then on `get` answers NotFound naming it. */
  reported?: boolean;
}

export type Checked =
  | { state: 'running'; rec: Followed }
  | { state: 'done'; rec: Followed }
  | { state: 'failed'; rec: Followed; failure: ProviderError };

export interface OperationFollowerOptions {
  provider: string;
  /** How long a write waits for its operation before answering "still running". */
  waitMs: number;
  /** Deadline of each wait/get request. */
  callTimeoutMs: number;
  /** How long a record is kept at most (an operation nobody asks about again). */
  keepMs: number;
  now: () => number;
  log: Logger;
}

const DONE = 'DONE';

/** `status` arrives as the enum's name over REST; anything else is not done. */
export function isDone(op: GceOperation | undefined): boolean {
  return op?.status === DONE;
}

/** The operation's error as a ProviderError of the class its code calls for, or undefined. */
export function operationError(
  op: GceOperation,
  kind: OperationKind,
  where: Where,
): ProviderError | undefined {
  const errors = (op.error?.errors ?? []).filter((e) => e.code || e.message);
  const first = errors[0];
  if (!first) return undefined;
  const code = first.code ?? 'UNKNOWN';
  if (kind === 'delete' && code === 'RESOURCE_NOT_FOUND') return undefined; // gone is what we want
  const http = op.httpErrorStatusCode ?? undefined;
  const detail = errors
    .map((e) => `${e.code ?? 'UNKNOWN'}: ${redact(e.message ?? '', where.secrets)}`)
    .join('; ')
    .slice(0, 512);
  const cls: ErrorClass = classForOperation(code, http);
  const target = where.providerID ? ` ${where.providerID}` : '';
  return new ProviderError(
    cls,
    `${where.provider} ${where.op}${target}: ${kind} operation failed: ${detail}`,
    {
      op: where.op,
      provider: where.provider,
      ...(where.providerID ? { providerID: where.providerID } : {}),
      cause: new GcpApiError(detail, http, undefined, code),
    },
  );
}

export class OperationFollower {
  private readonly followed = new Map<string, Followed>();
  private readonly o: OperationFollowerOptions;
  constructor(o: OperationFollowerOptions) {
    this.o = o;
  }

  /** The record of `id`, dropping it when it outlived `keepMs`. */
  recorded(id: string): Followed | undefined {
    const rec = this.followed.get(id);
    if (rec && this.o.now() - rec.since > this.o.keepMs) {
      this.followed.delete(id);
      return undefined;
    }
    return rec;
  }

  forget(id: string): void {
    this.followed.delete(id);
  }

  /**
   * After GCE accepted a write: waits for its operation up to `waitMs`. 'done' when it ended
   * well, 'running' when it is still going (remembered for the next call); throws its error.
   */
  async settle(
    ctx: { signal: AbortSignal; log: Logger },
    c: Clients,
    accepted: GceOperation | undefined,
    rec: Omit<Followed, 'operation' | 'since'>,
    where: Where,
  ): Promise<'done' | 'running'> {
    const id = providerIDOf(rec.ref);
    const name = accepted?.name;
    if (!name) return 'done'; // nothing to follow (never seen from GCE): the next read tells
    this.followed.set(id, { ...rec, operation: name, since: this.o.now() });
    let op: GceOperation | undefined = accepted;
    if (!isDone(op)) {
      try {
        op = await this.waitFor(ctx.signal, c, rec.ref, name);
      } catch (err) {
        if (ctx.signal.aborted) throw toProviderError(err, where, ctx.signal);
        // The write was accepted; a failed wait only means we do not know yet.
        ctx.log.debug({ err, operation: name }, 'gcp operation wait failed; following it later');
        return 'running';
      }
    }
    if (!isDone(op)) return 'running';
    this.followed.delete(id);
    const failure = op ? operationError(op, rec.kind, where) : undefined;
    if (failure) {
      this.o.log.warn({ err: failure, operation: name }, `gcp ${rec.kind} operation failed`);
      throw failure;
    }
    return 'done';
  }

  /** Looks once (no waiting) at the remembered operation of `id`; undefined when there is none. */
  async check(
    ctx: { signal: AbortSignal; log: Logger },
    c: Clients,
    id: string,
    where: Where,
  ): Promise<Checked | undefined> {
    const rec = this.recorded(id);
    if (!rec) return undefined;
    if (rec.failure) return { state: 'failed', rec, failure: rec.failure };
    let op: GceOperation | undefined;
    try {
      [op] = await raceSignal(
        () =>
          c
            .zoneOperations()
            .get(
              { project: rec.ref.project, zone: rec.ref.zone, operation: rec.operation },
              { retry: null, timeout: this.o.callTimeoutMs },
            ),
        ctx.signal,
      );
    } catch (err) {
      if (parseError(err).http === 404) {
        // GCE no longer knows it (operations are kept for a while only): nothing to follow.
        this.followed.delete(id);
        return undefined;
      }
      throw toProviderError(err, where, ctx.signal);
    }
    if (!isDone(op)) return { state: 'running', rec };
    const failure = operationError(op, rec.kind, { ...where, op: providerOpOf(rec.kind) });
    if (!failure) {
      this.followed.delete(id);
      return { state: 'done', rec };
    }
    this.o.log.warn({ err: failure, operation: rec.operation }, `gcp ${rec.kind} operation failed`);
    rec.failure = failure;
    return { state: 'failed', rec, failure };
  }

  /**
   * A reported insert failure, as `get` answers it from then on: the instance does not exist
   * because it was never created. `op: 'create'` tells that apart from an instance that
   * existed and went away.
   */
  neverCreated(rec: Followed, where: Where): ProviderError {
    const why = rec.failure?.message.replace(/^.*?: insert operation failed: /, '') ?? 'unknown error';
    return notFound(
      `${where.provider} get ${where.providerID}: instance does not exist, its insert failed: ${why}`,
      {
        op: 'create',
        provider: where.provider,
        ...(where.providerID ? { providerID: where.providerID } : {}),
        ...(rec.failure ? { cause: rec.failure.cause } : {}),
      },
    );
  }

  /** `wait` until the operation is DONE or the deadline passes; a timed-out wait is "running". */
  private async waitFor(
    signal: AbortSignal,
    c: Clients,
    ref: GcpRef,
    operation: string,
  ): Promise<GceOperation | undefined> {
    const deadline = this.o.now() + this.o.waitMs;
    let last: GceOperation | undefined;
    for (let left = this.o.waitMs; left > 0; left = deadline - this.o.now()) {
      try {
        [last] = await raceSignal(
          () =>
            c
              .zoneOperations()
              .wait(
                { project: ref.project, zone: ref.zone, operation },
                { retry: null, timeout: Math.min(left, this.o.callTimeoutMs) },
              ),
          signal,
        );
      } catch (err) {
        if (!signal.aborted && parseError(err).timeout) return last;
        throw err;
      }
      if (isDone(last)) return last;
    }
    return last;
  }
}
