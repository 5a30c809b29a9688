/**
 * providerhealth/status — pure: previous ProviderHealth status + one round's check result →
 * the next status. A target keeps its lastTransitionTime while `ready` does not flip, so each
 * host shows when it went down.
 */

import { setCondition } from '../api/conditions.ts';
import { CONDITION_READY } from '../api/constants.ts';
import type { ProviderHealthStatus, TargetCheck, TargetStatus } from '../api/providerhealth.ts';

const MAX_MESSAGE_LENGTH = 1024;

export interface CheckResult {
  /** Provider type (kubernetes, gcp, kvm, local, aws). */
  type: string;
  /** false: the provider has no Checker. */
  supported: boolean;
  targets: TargetCheck[];
  checkedAt: Date;
}

/** Cut to at most n characters (code points, as the API server counts maxLength). */
export function truncate(s: string, n: number): string {
  const chars = [...s];
  return chars.length <= n ? s : `${chars.slice(0, n - 1).join('')}…`;
}

export function buildStatus(prev: ProviderHealthStatus | undefined, r: CheckResult): ProviderHealthStatus {
  const now = r.checkedAt.toISOString();
  const before = new Map((prev?.targets ?? []).map((t) => [t.name, t]));
  const failing: string[] = [];
  let ready = 0;
  const targets: TargetStatus[] = r.targets.map((ts) => {
    const b = before.get(ts.name);
    if (ts.ready) ready++;
    else failing.push(`${ts.name}: ${ts.reason}`);
    const out: TargetStatus = {
      name: ts.name,
      ready: ts.ready,
      reason: ts.reason,
      lastTransitionTime: b && b.ready === ts.ready && b.lastTransitionTime ? b.lastTransitionTime : now,
    };
    if (ts.address !== undefined) out.address = ts.address;
    if (ts.message) out.message = truncate(ts.message, MAX_MESSAGE_LENGTH);
    if (ts.latencyMillis !== undefined) out.latencyMillis = Math.max(0, Math.round(ts.latencyMillis));
    if (ts.details && Object.keys(ts.details).length > 0) out.details = ts.details;
    return out;
  });

  let cond: { status: 'True' | 'False' | 'Unknown'; reason: string; message: string };
  if (!r.supported) {
    cond = {
      status: 'Unknown',
      reason: 'ChecksNotImplemented',
      message: `${r.type} providers have no health check`,
    };
  } else if (targets.length === 0) {
    cond = { status: 'Unknown', reason: 'NoTargets', message: 'the provider has nothing to check' };
  } else if (failing.length === 0) {
    cond = {
      status: 'True',
      reason: 'AllTargetsReady',
      message: `${ready} of ${targets.length} targets ready`,
    };
  } else {
    cond = {
      status: 'False',
      reason: 'TargetsNotReady',
      message: truncate(failing.join('; '), MAX_MESSAGE_LENGTH),
    };
  }
  const status: ProviderHealthStatus = {
    type: r.type,
    conditions: setCondition(prev?.conditions, { type: CONDITION_READY, ...cond }, r.checkedAt),
    targets,
    lastCheckTime: now,
  };
  if (r.supported) status.targetsReady = `${ready}/${targets.length}`;
  return status;
}
