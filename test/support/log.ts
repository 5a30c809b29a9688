/**
 * test/support/log — a logger that keeps every line it writes, for tests that assert what a
 * component logs (or that it never logs a secret). Plain pino without the production redaction:
 * a test must see anything that was handed to a logger at all.
 */
import pino, { type Level, type Logger } from 'pino';

export interface CapturedLog {
  log: Logger;
  /** The JSON lines as written, in order (live). */
  raw: string[];
  /** The same lines parsed (live). */
  lines: Array<Record<string, unknown>>;
}

export function captureLog(level: Level = 'debug'): CapturedLog {
  const raw: string[] = [];
  const lines: Array<Record<string, unknown>> = [];
  const write = (line: string): void => {
    raw.push(line);
    lines.push(JSON.parse(line) as Record<string, unknown>);
  };
  return { log: pino({ level }, { write }), raw, lines };
}
