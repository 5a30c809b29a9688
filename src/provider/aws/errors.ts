/**
 * provider/aws/errors — EC2 (and SSM) answers and transport failures as our four error classes
 * and as provider-health reasons. The SDK's errors carry the raw response; they are never passed
 * on: the kept cause is an AwsApiError with only the AWS error code, the HTTP status and the
 * (redacted) server message, and the code is in every message, so a condition names it.
 */
import { errorMessage } from '../../log/errors.ts';
import { callSite, type ErrorClass, ProviderError, redact } from '../errors.ts';

/** Throttled: the SDK already retried with backoff; the reconciler's backoff takes over. */
export const THROTTLING_CODES: ReadonlySet<string> = new Set([
  'RequestLimitExceeded',
  'Throttling',
  'ThrottlingException',
  'RequestThrottled',
  'RequestThrottledException',
  'TooManyRequestsException',
]);

/** No capacity for this instance type in this zone: the next subnet (zone) is tried. */
export const CAPACITY_CODES: ReadonlySet<string> = new Set([
  'InsufficientInstanceCapacity',
  'InsufficientCapacity',
  'InsufficientHostCapacity',
  'InsufficientReservedInstanceCapacity',
  // The instance type is not offered in this zone: another zone may offer it.
  'Unsupported',
]);

/** Account quotas: waiting (slow retry) or a quota increase helps; ProviderHealth shows them. */
export const QUOTA_CODES: ReadonlySet<string> = new Set([
  'VcpuLimitExceeded',
  'InstanceLimitExceeded',
  'MaxSpotInstanceCountExceeded',
  'SpotMaxPriceTooLow',
  'ResourceLimitExceeded',
  'AddressLimitExceeded',
  'SecurityGroupLimitExceeded',
]);

/** The request can never succeed as it is: credentials, permissions, a bad image or subnet. */
export const PERMANENT_CODES: ReadonlySet<string> = new Set([
  'UnauthorizedOperation',
  'AuthFailure',
  'InvalidClientTokenId',
  'SignatureDoesNotMatch',
  'OptInRequired',
  'Blocked',
  'PendingVerification',
  'IdempotentParameterMismatch',
  'MissingParameter',
  'ParameterNotFound',
  'AccessDeniedException',
]);

export type Where = { op: string; provider: string; providerID?: string; secrets?: readonly string[] };

/** What we keep of a failed API call: the AWS code, the HTTP status and the server's words. */
export class AwsApiError extends Error {
  readonly code: string | undefined;
  readonly httpStatusCode: number | undefined;
  constructor(message: string, code?: string, httpStatusCode?: number) {
    super(message);
    this.name = 'AwsApiError';
    this.code = code;
    this.httpStatusCode = httpStatusCode;
  }
}

interface Parsed {
  code: string | undefined;
  http: number | undefined;
  message: string;
  /** An abort or deadline on our side (no answer). */
  timeout: boolean;
}

/** The facts of any error thrown by an SDK client (or around it). */
export function parseError(err: unknown): Parsed {
  if (err instanceof AwsApiError) {
    return { code: err.code, http: err.httpStatusCode, message: err.message, timeout: false };
  }
  const e = (typeof err === 'object' && err !== null ? err : {}) as {
    name?: unknown;
    Code?: unknown;
    $fault?: unknown;
    $metadata?: { httpStatusCode?: unknown };
  };
  const http = typeof e.$metadata?.httpStatusCode === 'number' ? e.$metadata.httpStatusCode : undefined;
  const name = typeof e.name === 'string' ? e.name : undefined;
  const timeout = name === 'AbortError' || name === 'TimeoutError';
  // Service errors have $fault; their name is the AWS error code.
  const code = e.$fault !== undefined ? (typeof e.Code === 'string' ? e.Code : name) : undefined;
  return { code, http, message: errorMessage(err), timeout };
}

/** The class of an AWS error code (and HTTP status when the code says nothing). */
export function classForCode(code: string | undefined, http: number | undefined): ErrorClass {
  if (code !== undefined) {
    if (THROTTLING_CODES.has(code)) return 'Transient';
    if (QUOTA_CODES.has(code) || CAPACITY_CODES.has(code)) return 'QuotaExceeded';
    if (PERMANENT_CODES.has(code)) return 'Permanent';
    if (code.endsWith('.NotFound') || code.endsWith('.Malformed') || code.startsWith('Invalid')) {
      // A missing or malformed image, subnet, group, parameter: this request cannot work.
      return 'Permanent';
    }
  }
  if (http === undefined || http >= 500 || http === 429) return 'Transient';
  return http === 401 || http === 403 ? 'Permanent' : 'Transient';
}

/** `err` as a ProviderError of its class, the AWS code first in the message. */
export function toProviderError(err: unknown, where: Where, signal?: AbortSignal): ProviderError {
  if (err instanceof ProviderError) return err;
  const { prefix, opts } = callSite(where);
  const p = parseError(err);
  const message = redact(p.message, where.secrets).slice(0, 512);
  const cause = new AwsApiError(message, p.code, p.http);
  if (p.code === undefined && (signal?.aborted || p.timeout)) {
    return new ProviderError('Transient', `${prefix}: request aborted or timed out`, { ...opts, cause });
  }
  const code = p.code ? `${p.code}: ` : '';
  return new ProviderError(classForCode(p.code, p.http), `${prefix}: ${code}${message}`, { ...opts, cause });
}

/** Provider-health reason for a failed check call. */
export function checkReason(err: unknown, signal?: AbortSignal): string {
  const p = parseError(err);
  if (p.code === undefined && (signal?.aborted || p.timeout)) return 'Timeout';
  if (p.code !== undefined) {
    if (THROTTLING_CODES.has(p.code)) return 'Throttled';
    if (p.code === 'AuthFailure' || p.code === 'InvalidClientTokenId' || p.code === 'SignatureDoesNotMatch')
      return 'Unauthorized';
    if (p.code === 'UnauthorizedOperation' || p.code === 'OptInRequired' || p.code === 'Blocked')
      return 'Forbidden';
    return 'APIError';
  }
  return p.http !== undefined ? 'APIError' : 'Unreachable';
}

export function checkMessage(err: unknown): string {
  const p = parseError(err);
  if (p.code === undefined && p.timeout) return 'request aborted or timed out';
  return `${p.code ? `${p.code}: ` : ''}${p.message}`.slice(0, 1024);
}

/** An abort as the SDK would report it, for a call not even started. */
export function abortedError(): Error {
  const e = new Error('the call was aborted');
  e.name = 'AbortError';
  return e;
}
