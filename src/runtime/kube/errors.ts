/**
 * runtime/kube/errors — turns client-node failures into StoreErrors. client-node's ApiException
 * carries the response body as raw text, so the Kubernetes Status is parsed here; watch errors
 * are plain Errors with a `statusCode`. Transport failures (fetch failed, aborts) pass through.
 */
import { ApiException } from '@kubernetes/client-node';
import { StoreError, type StoreErrorReason } from '../store.ts';

interface KubeStatus {
  kind?: string;
  status?: string;
  message?: string;
  reason?: string;
  code?: number;
}

/** Parses a Status out of an ApiException body (a string in client-node 2.x, sometimes an object). */
export function parseStatus(body: unknown): KubeStatus | undefined {
  let v: unknown = body;
  if (typeof body === 'string') {
    try {
      v = JSON.parse(body);
    } catch {
      return undefined;
    }
  }
  if (typeof v !== 'object' || v === null) return undefined;
  const s = v as KubeStatus;
  return s.kind === 'Status' || typeof s.reason === 'string' || typeof s.message === 'string' ? s : undefined;
}

/** Our reason for an HTTP status and Kubernetes Status reason. */
export function reasonFor(code: number, statusReason?: string): StoreErrorReason {
  if (code === 404) return 'NotFound';
  if (code === 409) return statusReason === 'AlreadyExists' ? 'AlreadyExists' : 'Conflict';
  if (code === 410) return 'Gone';
  if (code === 422) return 'Invalid';
  if (code === 401 || code === 403) return 'Forbidden';
  if (code === 400 || code === 405 || code === 415) return 'BadRequest';
  return 'Unavailable'; // 429, 5xx, anything unexpected: worth retrying
}

/** The HTTP status of a client-node error (ApiException or watch error), if it has one. */
export function statusCodeOf(e: unknown): number | undefined {
  if (e instanceof ApiException) return e.code;
  if (e instanceof StoreError) return e.code;
  if (typeof e === 'object' && e !== null && 'statusCode' in e) {
    const c = (e as { statusCode: unknown }).statusCode;
    return typeof c === 'number' ? c : undefined;
  }
  return undefined;
}

/**
 * A StoreError for API failures; other errors are returned unchanged. `what` names the object
 * or operation for the message (never credentials: messages come from the API server's Status).
 */
export function toStoreError(e: unknown, what: string): unknown {
  if (e instanceof StoreError) return e;
  const code = statusCodeOf(e);
  if (code === undefined) return e;
  const status = e instanceof ApiException ? parseStatus(e.body) : undefined;
  const reason = reasonFor(code, status?.reason);
  const detail = status?.message ?? (e instanceof Error && !(e instanceof ApiException) ? e.message : '');
  const message = `${what}: ${reason} (HTTP ${code})${detail ? `: ${detail}` : ''}`;
  return new StoreError(reason, code, message, { cause: e });
}

/** Runs an API call, rethrowing API failures as StoreErrors. */
export async function kubeCall<T>(what: string, fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (e) {
    throw toStoreError(e, what);
  }
}
