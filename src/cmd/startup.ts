/**
 * cmd/startup — what start-up failures look like (one line for the user) and how what was
 * built gets closed again: every resource is registered on a Teardown as soon as it exists, so
 * a failure at any later step, and a normal stop, close exactly what exists, newest first.
 */
import type { Logger } from '../log/index.ts';

/** A start-up problem the user must fix; printed as one line. */
export class StartupError extends Error {
  constructor(message: string, opts?: { cause?: unknown }) {
    super(message, opts);
    this.name = 'StartupError';
  }
}

export class Teardown {
  private readonly steps: Array<{ what: string; close: () => unknown }> = [];

  /** Registers how to close `what`; closed before everything registered earlier. */
  add(what: string, close: () => unknown): void {
    this.steps.push({ what, close });
  }

  /** Closes everything registered, newest first, each once; rejects with the first failure after all ran. */
  async close(): Promise<void> {
    let first: unknown;
    for (let step = this.steps.pop(); step; step = this.steps.pop()) {
      try {
        await step.close();
      } catch (err) {
        first ??= err;
      }
    }
    if (first !== undefined) throw first;
  }

  /** Start-up failed: close what exists (logging, not throwing, a failure to close) and rethrow. */
  async abandon(err: unknown, log: Logger): Promise<never> {
    await this.close().catch((closeErr: unknown) =>
      log.warn({ err: closeErr }, 'closing after a start-up failure failed'),
    );
    throw err;
  }
}
