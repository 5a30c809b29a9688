/**
 * provider/kubernetes/errors — API server answers and transport failures as our four error
 * classes, and as the provider-health reasons. Messages carry the HTTP code and the Status
 * reason/message only: client-node's own error text embeds whole response bodies and headers,
 * so it is never passed on (nor kept as `cause`).
 */
import { ApiException } from '@kubernetes/client-node';
import { parseStatus } from '../../runtime/kube/errors.ts';
import { callSite, type ErrorClass, ProviderError } from '../errors.ts';

export function apiCode(err: unknown): number | undefined {
  return err instanceof ApiException ? err.code : undefined;
}

/** Class of an HTTP answer: quota is a 403 whose Status says so (ResourceQuota admission). */
export function classForStatus(code: number, message = ''): ErrorClass {
  if (code === 404) return 'NotFound';
  if (code === 403 && /exceeded quota/i.test(message)) return 'QuotaExceeded';
  if ([400, 401, 403, 405, 415, 422].includes(code)) return 'Permanent';
  return 'Transient'; // 409 outside create, 429, 5xx, anything unexpected
}

export interface Where {
  op: string;
  provider: string;
  providerID?: string;
  /** false: leave the Status message out (Secret calls: validation messages may quote data). */
  statusMessage?: boolean;
}

/** Any failure of an API call as a ProviderError with a class. */
export function toProviderError(err: unknown, where: Where, signal?: AbortSignal): ProviderError {
  const { prefix, opts } = callSite(where);
  if (err instanceof ProviderError) return err;
  if (err instanceof ApiException) {
    const status = parseStatus(err.body);
    const msg = status?.message ?? '';
    const detail = where.statusMessage !== false && msg ? `: ${msg.slice(0, 512)}` : '';
    return new ProviderError(
      classForStatus(err.code, msg),
      `${prefix}: HTTP ${err.code}${status?.reason ? ` ${status.reason}` : ''}${detail}`,
      opts,
    );
  }
  if (signal?.aborted || isAbort(err)) {
    return new ProviderError('Transient', `${prefix}: request aborted or timed out`, opts);
  }
  return new ProviderError('Transient', `${prefix}: ${transportMessage(err)}`, { ...opts, cause: err });
}

/** Provider-health reason for a failed check call. */
export function checkReason(err: unknown, signal?: AbortSignal): string {
  if (signal?.aborted || isAbort(err)) return 'Timeout';
  if (err instanceof ApiException) {
    const status = parseStatus(err.body);
    if (err.code === 401) return 'Unauthorized';
    if (err.code === 403) return 'Forbidden';
    // ServerTimeout is the API server giving up on its own deadline (a 500), not a server fault.
    if (err.code === 504 || status?.reason === 'Timeout' || status?.reason === 'ServerTimeout') {
      return 'Timeout';
    }
    return 'APIError';
  }
  return 'Unreachable';
}

export function checkMessage(err: unknown): string {
  if (err instanceof ApiException) {
    const status = parseStatus(err.body);
    return `HTTP ${err.code}${status?.reason ? ` ${status.reason}` : ''}${status?.message ? `: ${status.message}` : ''}`.slice(
      0,
      1024,
    );
  }
  if (isAbort(err)) return 'request aborted or timed out';
  return transportMessage(err).slice(0, 1024);
}

function isAbort(err: unknown): boolean {
  return err instanceof Error && (err.name === 'AbortError' || err.name === 'TimeoutError');
}

/** `fetch failed (ECONNREFUSED)` rather than just `fetch failed`. */
function transportMessage(err: unknown): string {
  if (!(err instanceof Error)) return String(err);
  const cause = err.cause as { code?: unknown; message?: unknown } | undefined;
  const code = typeof cause?.code === 'string' ? cause.code : undefined;
  return code ? `${err.message} (${code})` : err.message;
}
