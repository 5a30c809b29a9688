/**
 * test/support/wait — the one way tests wait for something to happen: poll with a bound, fail
 * with what was awaited and the last error, and stop early when waiting became pointless (a
 * process exited). Never a fixed sleep: a test waits exactly as long as the behaviour takes.
 */

export interface UntilOptions {
  /** Give up after this long. Default 5 s. */
  timeoutMs?: number;
  /** Time between attempts. Default 10 ms. */
  intervalMs?: number;
  /** Checked after each failed attempt: a message aborts the wait at once (e.g. "process exited"). */
  failFast?: () => string | undefined;
}

/**
 * Polls `probe` until it returns something other than undefined/false and returns that; a
 * throwing probe counts as "not yet" (its error is reported on timeout).
 */
export async function until<T>(
  what: string,
  probe: () => T | undefined | false | Promise<T | undefined | false>,
  options: UntilOptions | number = {},
): Promise<T> {
  const opts = typeof options === 'number' ? { timeoutMs: options } : options;
  const timeoutMs = opts.timeoutMs ?? 5000;
  const intervalMs = opts.intervalMs ?? 10;
  const deadline = Date.now() + timeoutMs;
  let lastError: unknown;
  for (;;) {
    try {
      const v = await probe();
      if (v !== undefined && v !== false) return v;
    } catch (err) {
      lastError = err;
    }
    const fatal = opts.failFast?.();
    if (fatal !== undefined) throw new Error(`gave up waiting for ${what}: ${fatal}`);
    if (Date.now() >= deadline) {
      const why = lastError instanceof Error ? ` (last error: ${lastError.message})` : '';
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${why}`);
    }
    await new Promise((r) => setTimeout(r, intervalMs));
  }
}
