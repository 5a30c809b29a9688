/**
 * runtime/retry — "write, and on Conflict re-read and write again": the one way every status
 * writer (reconciler, health engine, egress check) survives a concurrent writer, in the manner
 * of client-go's `retry.RetryOnConflict`.
 */

import { isConflict } from './store.ts';

/** Default number of writes before a Conflict is given back to the caller. */
export const DEFAULT_CONFLICT_ATTEMPTS = 5;

export interface RetryOnConflictOptions {
  /** Writes in all, the first included (≥ 1). */
  attempts?: number;
  signal?: AbortSignal;
}

/**
 * Calls `write(current)`, starting from `initial`. On a Conflict it calls `reread()` for the
 * freshest object and writes again, at most `attempts` writes in all; the last Conflict, and
 * every other error (NotFound included) from `write` or `reread`, is thrown to the caller.
 * `write` decides from the object it gets whether there is still anything to write.
 */
export async function retryOnConflict<T, R>(
  initial: T,
  write: (current: T) => Promise<R>,
  reread: () => Promise<T>,
  opts: RetryOnConflictOptions = {},
): Promise<R> {
  const attempts = Math.max(1, opts.attempts ?? DEFAULT_CONFLICT_ATTEMPTS);
  let current = initial;
  for (let attempt = 1; ; attempt++) {
    try {
      return await write(current);
    } catch (err) {
      if (!isConflict(err) || attempt >= attempts || opts.signal?.aborted) throw err;
      current = await reread();
    }
  }
}
