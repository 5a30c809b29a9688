/**
 * log — structured logging for every component: JSON lines (pino) carrying the active
 * trace_id/span_id, human-readable when stdout is a terminal. Secrets are redacted by path
 * as a second line of defence; the first is never handing them to a logger at all. Errors go in
 * as `{ err }` and come out through `serializeError` (log/errors.ts).
 */
import { isSpanContextValid, trace } from '@opentelemetry/api';
import { type Logger, pino } from 'pino';
import { serializeError } from './errors.ts';

export type { Logger } from 'pino';

const REDACT_PATHS = [
  'password',
  'credentials',
  'cloudInit',
  'userData',
  'token',
  'authorization',
  '*.password',
  '*.credentials',
  '*.cloudInit',
  '*.userData',
  '*.token',
  '*.authorization',
  'headers.authorization',
  'headers["proxy-authorization"]',
];

export interface LogOptions {
  level?: string;
  /** true: pretty lines for people; false: JSON; default: pretty when stdout is a TTY. */
  pretty?: boolean;
  destination?: NodeJS.WritableStream;
}

export function createLogger(opts: LogOptions = {}): Logger {
  const pretty = opts.pretty ?? Boolean(process.stdout.isTTY);
  const base = {
    level: opts.level ?? process.env.LOG_LEVEL ?? 'info',
    base: undefined,
    redact: { paths: REDACT_PATHS, censor: '[redacted]' },
    // `{ err }` is how every component logs an error: only safe fields, text redacted.
    serializers: { err: serializeError },
    mixin() {
      const span = trace.getActiveSpan();
      if (!span) return {};
      const ctx = span.spanContext();
      // The no-op tracer (tracing off) still activates spans, with all-zero IDs: omit those.
      if (!isSpanContextValid(ctx)) return {};
      return { trace_id: ctx.traceId, span_id: ctx.spanId };
    },
    timestamp: pino.stdTimeFunctions.isoTime,
  };
  if (pretty && !opts.destination) {
    return pino({
      ...base,
      transport: {
        target: 'pino-pretty',
        options: { colorize: true, singleLine: true, translateTime: 'HH:MM:ss.l', ignore: 'pid,hostname' },
      },
    });
  }
  return opts.destination ? pino(base, opts.destination as unknown as pino.DestinationStream) : pino(base);
}

/** A logger that drops everything, for tests and library defaults. */
export function silentLogger(): Logger {
  return pino({ level: 'silent' });
}
