/**
 * kube-server/status — Kubernetes `Status` bodies for errors, the way the apiserver writes them
 * (client-node parses `reason`/`code` out of the raw body text), with the `details` it sends:
 * none for a request it could not decode (400), the engine's own where the engine knows better
 * (causes, the kind instead of the resource), else the object the request named.
 */
import { type ErrorDetails, ObjectError } from '../../../src/runtime/objects/errors.ts';
import { StoreError } from '../../../src/runtime/store.ts';

export interface StatusBody {
  kind: 'Status';
  apiVersion: 'v1';
  metadata: Record<string, never>;
  status: 'Failure' | 'Success';
  message?: string;
  reason?: string;
  details?: ErrorDetails & { uid?: string };
  code?: number;
}

const REASONS: Record<string, string> = {
  Gone: 'Expired',
  Unavailable: 'ServiceUnavailable',
};

export function statusOf(
  code: number,
  reason: string,
  message: string,
  details?: StatusBody['details'],
): StatusBody {
  return {
    kind: 'Status',
    apiVersion: 'v1',
    metadata: {},
    status: 'Failure',
    message,
    reason,
    ...(details ? { details } : {}),
    code,
  };
}

/** What a successful DELETE that removed the object answers with. */
export function deletedStatus(details: StatusBody['details']): StatusBody {
  return {
    kind: 'Status',
    apiVersion: 'v1',
    metadata: {},
    status: 'Success',
    ...(details ? { details } : {}),
  };
}

export class HttpError extends Error {
  readonly status: StatusBody;
  constructor(code: number, reason: string, message: string, details?: StatusBody['details']) {
    super(message);
    this.status = statusOf(code, reason, message, details);
  }
}

/** An internal error the apiserver reports with neither reason nor details (code and message only). */
export class InternalError extends Error {
  readonly status: StatusBody = {
    kind: 'Status',
    apiVersion: 'v1',
    metadata: {},
    status: 'Failure',
    code: 500,
  };
  constructor(message: string) {
    super(message);
    this.status.message = message;
  }
}

/** Maps any thrown error onto a Status (unknown errors are 500 InternalError). */
export function toStatus(e: unknown, details?: StatusBody['details']): StatusBody {
  if (e instanceof HttpError || e instanceof InternalError) return e.status;
  if (e instanceof ObjectError) return statusOf(e.code, REASONS[e.reason] ?? e.reason, e.message, e.details);
  if (e instanceof StoreError) {
    // A body the server could not decode names no object.
    const d = e.reason === 'BadRequest' ? undefined : details;
    return statusOf(e.code, REASONS[e.reason] ?? e.reason, e.message, d);
  }
  return statusOf(500, 'InternalError', e instanceof Error ? e.message : String(e));
}
