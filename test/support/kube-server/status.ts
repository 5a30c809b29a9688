/**
 * kube-server/status — Kubernetes `Status` bodies for errors, the way the apiserver writes them
 * (client-node parses `reason`/`code` out of the raw body text).
 */
import { StoreError } from '../../../src/runtime/store.ts';

export interface StatusBody {
  kind: 'Status';
  apiVersion: 'v1';
  metadata: Record<string, never>;
  status: 'Failure' | 'Success';
  message: string;
  reason: string;
  details?: { name?: string; group?: string; kind?: string };
  code: number;
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

export class HttpError extends Error {
  readonly status: StatusBody;
  constructor(code: number, reason: string, message: string) {
    super(message);
    this.status = statusOf(code, reason, message);
  }
}

/** Maps any thrown error onto a Status (unknown errors are 500 InternalError). */
export function toStatus(e: unknown, details?: StatusBody['details']): StatusBody {
  if (e instanceof HttpError) return e.status;
  if (e instanceof StoreError) return statusOf(e.code, REASONS[e.reason] ?? e.reason, e.message, details);
  return statusOf(500, 'InternalError', e instanceof Error ? e.message : String(e));
}
