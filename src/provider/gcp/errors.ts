/**
 * provider/gcp/errors — Compute Engine answers and transport failures as our four error classes
 * and as provider-health reasons. google-gax errors carry the gaxios request config (headers,
 * possibly a bearer token) in their `cause`, so they are never passed on: the kept cause is a
 * GcpApiError holding only the status, the reason and the (redacted) server message.
 */
import { errorMessage } from '../../log/errors.ts';
import { callSite, type ErrorClass, ProviderError, redact } from '../errors.ts';

/** google-gax keeps the raw body of an HTTP error under this global symbol. */
const RAW_PAYLOAD = Symbol.for('google-gax.rawHttpResponsePayload');

/** gRPC codes google-gax sets when there is no HTTP status (transport-level failures). */
const GRPC_DEADLINE_EXCEEDED = 4;
const GRPC_CANCELLED = 1;

/**
 * Reasons GCE uses for quota, rate limits and capacity stock-outs: waiting (slow backoff) is
 * the right answer to all of them, unlike other 403s (permissions, disabled API).
 */
const QUOTA_REASONS = new Set(
  [
    'QUOTA_EXCEEDED',
    'quotaExceeded',
    'rateLimitExceeded',
    'userRateLimitExceeded',
    'RATE_LIMIT_EXCEEDED',
    'dailyLimitExceeded',
    'ZONE_RESOURCE_POOL_EXHAUSTED',
    'ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS',
    'REGION_RESOURCE_POOL_EXHAUSTED',
    'RESOURCE_OPERATION_RATE_EXCEEDED',
    'resourcePoolExhausted',
  ].map((r) => r.toLowerCase()),
);

/** Operation error codes that say the request itself cannot succeed as it is. */
const PERMANENT_OPERATION_CODE =
  /NOT_FOUND|INVALID|PERMISSION|FORBIDDEN|UNSUPPORTED|ALREADY_EXISTS|BAD_REQUEST|CONDITION_NOT_MET/;

/**
 * Class of an operation that ended in an error. The code decides first (quota and capacity
 * stock-outs wait slowly whatever HTTP status GCE attached); then `httpErrorStatusCode`, with
 * 404 as Permanent — a missing image or network is what an insert's 404 means, not a missing
 * instance; then the code's wording; anything else (INTERNAL_ERROR, …) is worth a retry.
 */
export function classForOperation(code: string, http: number | undefined): ErrorClass {
  if (QUOTA_REASONS.has(code.toLowerCase())) return 'QuotaExceeded';
  if (http === 404) return 'Permanent';
  if (http !== undefined && http >= 400) return classForStatus(http, code);
  return PERMANENT_OPERATION_CODE.test(code) ? 'Permanent' : 'Transient';
}

/** What we keep of a failed API call: nothing that was sent, only what the server said. */
export class GcpApiError extends Error {
  readonly httpStatusCode: number | undefined;
  readonly grpcCode: number | undefined;
  readonly reason: string | undefined;
  constructor(message: string, httpStatusCode?: number, grpcCode?: number, reason?: string) {
    super(message);
    this.name = 'GcpApiError';
    this.httpStatusCode = httpStatusCode;
    this.grpcCode = grpcCode;
    this.reason = reason;
  }
}

interface Parsed {
  http: number | undefined;
  grpc: number | undefined;
  reason: string | undefined;
  message: string;
  /** An abort or deadline on our side (no answer). */
  timeout: boolean;
}

/** The facts of any error thrown by the compute client (or around it). */
export function parseError(err: unknown): Parsed {
  if (err instanceof GcpApiError) {
    return {
      http: err.httpStatusCode,
      grpc: err.grpcCode,
      reason: err.reason,
      message: err.message,
      timeout: err.grpcCode === GRPC_DEADLINE_EXCEEDED,
    };
  }
  const e = (typeof err === 'object' && err !== null ? err : {}) as {
    code?: unknown;
    httpStatusCode?: unknown;
    reason?: unknown;
    message?: unknown;
    name?: unknown;
    [RAW_PAYLOAD]?: unknown;
  };
  const http = typeof e.httpStatusCode === 'number' ? e.httpStatusCode : undefined;
  const grpc = typeof e.code === 'number' ? e.code : undefined;
  let reason = typeof e.reason === 'string' && e.reason ? e.reason : undefined;
  let message = errorMessage(err);
  const raw = e[RAW_PAYLOAD];
  if (typeof raw === 'string') {
    const body = bodyFacts(raw);
    reason ??= body.reason;
    if (body.message) message = body.message;
    else if (http !== undefined) message = `HTTP ${http} with a body that is not a GCE error`;
  }
  const timeout =
    e.name === 'AbortError' ||
    e.name === 'TimeoutError' ||
    (http === undefined && (grpc === GRPC_DEADLINE_EXCEEDED || grpc === GRPC_CANCELLED));
  return { http, grpc, reason, message, timeout };
}

/** `errors[0].reason` (GCE), else the ErrorInfo reason, from a raw error body. */
function bodyFacts(raw: string): { reason?: string; message?: string } {
  try {
    const body = JSON.parse(raw) as {
      error?: {
        message?: unknown;
        errors?: Array<{ reason?: unknown }>;
        details?: Array<{ reason?: unknown }>;
      };
    };
    const er = body.error;
    const reason = [...(er?.errors ?? []), ...(er?.details ?? [])]
      .map((x) => x?.reason)
      .find((r): r is string => typeof r === 'string' && r !== '');
    const message = typeof er?.message === 'string' ? er.message : undefined;
    return { ...(reason ? { reason } : {}), ...(message ? { message } : {}) };
  } catch {
    return {};
  }
}

/** Class of a failed call from its HTTP status and GCE reason. */
export function classForStatus(http: number | undefined, reason?: string): ErrorClass {
  if (http === undefined) return 'Transient'; // network, deadline, token fetch
  if (http === 404) return 'NotFound';
  if ((http === 403 || http === 429) && reason && QUOTA_REASONS.has(reason.toLowerCase())) {
    return 'QuotaExceeded';
  }
  // 408: the server gave up waiting; 409 outside create: a concurrent operation on the resource.
  if (http === 408 || http === 409 || http === 429) return 'Transient';
  if (http >= 400 && http < 500) return 'Permanent';
  return 'Transient';
}

export interface Where {
  op: string;
  provider: string;
  providerID?: string;
  /** Strings that must not appear in the message (cloud-init, passwords). */
  secrets?: readonly string[];
}

/** Any failure of an API call as a ProviderError with a class and a sanitized cause. */
export function toProviderError(err: unknown, where: Where, signal?: AbortSignal): ProviderError {
  if (err instanceof ProviderError) return err;
  const { prefix, opts } = callSite(where);
  const p = parseError(err);
  const message = redact(p.message, where.secrets).slice(0, 512);
  const cause = new GcpApiError(message, p.http, p.grpc, p.reason);
  if (p.http === undefined && (signal?.aborted || p.timeout)) {
    return new ProviderError('Transient', `${prefix}: request aborted or timed out`, { ...opts, cause });
  }
  const status = p.http === undefined ? '' : `HTTP ${p.http}${p.reason ? ` ${p.reason}` : ''}: `;
  return new ProviderError(classForStatus(p.http, p.reason), `${prefix}: ${status}${message}`, {
    ...opts,
    cause,
  });
}

/** Provider-health reason for a failed check call. */
export function checkReason(err: unknown, signal?: AbortSignal): string {
  const p = parseError(err);
  if (p.http === undefined && (signal?.aborted || p.timeout)) return 'Timeout';
  if (p.http === 401) return 'Unauthorized';
  if (p.http === 403) return 'Forbidden';
  if (p.http === 504) return 'Timeout';
  if (p.http !== undefined) return 'APIError';
  return 'Unreachable'; // connection refused/reset, DNS, no credentials, token endpoint down
}

export function checkMessage(err: unknown): string {
  const p = parseError(err);
  if (p.http === undefined && p.timeout) return 'request aborted or timed out';
  const status = p.http === undefined ? '' : `HTTP ${p.http}${p.reason ? ` ${p.reason}` : ''}: `;
  return `${status}${p.message}`.slice(0, 1024);
}

/**
 * Starts the call unless the signal has already aborted, and settles with its result or as
 * soon as the signal aborts — whichever comes first (an abandoned call runs on to its timeout).
 */
export function raceSignal<T>(start: (() => Promise<T>) | Promise<T>, signal: AbortSignal): Promise<T> {
  if (signal.aborted) {
    if (typeof start !== 'function') start.catch(() => {});
    return Promise.reject(abortError(signal));
  }
  const p = typeof start === 'function' ? start() : start;
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => {
      p.catch(() => {});
      reject(abortError(signal));
    };
    signal.addEventListener('abort', onAbort, { once: true });
    p.then(
      (v) => {
        signal.removeEventListener('abort', onAbort);
        resolve(v);
      },
      (e: unknown) => {
        signal.removeEventListener('abort', onAbort);
        reject(e);
      },
    );
  });
}

function abortError(signal: AbortSignal): Error {
  const reason = signal.reason as { name?: unknown } | undefined;
  const name = reason?.name === 'TimeoutError' ? 'TimeoutError' : 'AbortError';
  const e = new Error('the call was aborted');
  e.name = name;
  return e;
}
