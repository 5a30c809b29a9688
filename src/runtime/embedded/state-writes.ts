/**
 * runtime/embedded/state-writes — whether the standalone state directory still takes writes.
 * Each writer (the state journal, the lease checkpoint) reports every failed and every good
 * write here. A change of state is logged once — not once per failed write, which on a full
 * disk would be every few milliseconds — and while any writer fails, /readyz fails with the
 * reason: the process keeps serving from memory, but what it decides now would not survive a
 * restart, and a supervisor or operator has to see that.
 */
import { errorMessage } from '../../log/errors.ts';
import type { Logger } from '../../log/index.ts';
import { type Clock, systemClock } from '../clock.ts';

/** What one writer reports: the file it writes, and each attempt's outcome. */
export interface WriteHealth {
  failed(err: unknown): void;
  succeeded(): void;
}

interface Failure {
  path: string;
  /** errno code (ENOSPC, EROFS, EDQUOT, EIO…) or the message: a new one is logged again. */
  code: string;
  reason: string;
  since: number;
}

export class StateWrites {
  private readonly log: Logger;
  private readonly clock: Clock;
  private readonly failing = new Map<string, Failure>();

  constructor(log: Logger, clock: Clock = systemClock) {
    this.log = log;
    this.clock = clock;
  }

  /** The reporting handle of the writer `name` (e.g. "state journal") of file `path`. */
  writer(name: string, path: string): WriteHealth {
    return {
      failed: (err) => this.failed(name, path, err),
      succeeded: () => this.succeeded(name),
    };
  }

  private failed(name: string, path: string, err: unknown): void {
    const code = (err as NodeJS.ErrnoException | undefined)?.code ?? errorMessage(err);
    const before = this.failing.get(name);
    if (before && before.code === code) return;
    this.failing.set(name, {
      path,
      code,
      reason: errorMessage(err),
      since: before?.since ?? this.clock.now(),
    });
    this.log.error(
      { writer: name, path, code, err },
      `writing the ${name} failed; serving from memory and retrying (not ready until it is written)`,
    );
  }

  private succeeded(name: string): void {
    const before = this.failing.get(name);
    if (!before) return;
    this.failing.delete(name);
    this.log.info(
      { writer: name, path: before.path, failedForMs: this.clock.now() - before.since },
      `the ${name} is written again; nothing decided meanwhile was lost`,
    );
  }

  /** How many writers are failing now (a metric). */
  get failingCount(): number {
    return this.failing.size;
  }

  /** A readiness check: throws naming every failing writer, its file and its error. */
  readiness(): undefined {
    if (this.failing.size === 0) return undefined;
    const parts = [...this.failing].map(
      ([name, f]) =>
        `${name} ${f.path} cannot be written since ${new Date(f.since).toISOString()} (${f.reason})`,
    );
    throw new Error(`${parts.join('; ')}; serving from memory, retrying`);
  }
}
