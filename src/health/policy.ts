/**
 * health/policy — the pure rules of the health engine: the effective check for a proxy (engine
 * defaults + spec.healthCheck), the stable schedule offset, the verdict state machine and when
 * a latency change is worth reporting. Where a proxy is probed is api/proxy's servingEndpoint.
 */
import {
  DEFAULT_EXPECT_STATUS,
  DEFAULT_FAILURE_THRESHOLD,
  DEFAULT_HEALTH_URL,
  DEFAULT_INTERVAL_SECONDS,
  DEFAULT_SUCCESS_THRESHOLD,
  OPERATOR_PROBE_HOST,
} from '../api/health-defaults.ts';
import type { ProxyObject } from '../api/proxy.ts';
import { isHttpUrl, redactUrl } from '../api/url.ts';

/** The condition reason of a successful probe (failures carry the probe's own reason). */
export const REASON_PROBE_SUCCEEDED = 'ProbeSucceeded';
/**
 * Healthy=Unknown: the proxy serves no instance the engine has judged — it stopped serving (a
 * lost instance, an in-place restart) or serves a new instance not probed enough yet. A verdict
 * never outlives the instance it was about.
 */
export const REASON_NOT_SERVING = 'NotServing';

export interface HealthCheckDefaults {
  url: string;
  expectStatus: number;
  intervalMs: number;
  failureThreshold: number;
  successThreshold: number;
  /** Unset: min(5 s, interval × failureThreshold × 2/3). */
  timeoutMs?: number;
}

export const DEFAULT_HEALTH_CHECK: HealthCheckDefaults = {
  url: DEFAULT_HEALTH_URL,
  expectStatus: DEFAULT_EXPECT_STATUS,
  intervalMs: DEFAULT_INTERVAL_SECONDS * 1000,
  failureThreshold: DEFAULT_FAILURE_THRESHOLD,
  successThreshold: DEFAULT_SUCCESS_THRESHOLD,
};

export interface ResolvedCheck {
  url: string;
  /** `url` without userinfo, query or fragment: the only form logs, labels and status show. */
  shownUrl: string;
  expectStatus: number;
  intervalMs: number;
  timeoutMs: number;
  failureThreshold: number;
  successThreshold: number;
}

/** Why `raw` is not an absolute http(s) URL, or undefined when it is. Never echoes the URL: it may carry a key. */
export function httpUrlProblem(raw: string): string | undefined {
  if (isHttpUrl(raw)) return undefined;
  const scheme = /^([a-z][a-z0-9+.-]*):/i.exec(raw)?.[1]?.toLowerCase();
  if (scheme && scheme !== 'http' && scheme !== 'https') {
    return `scheme must be http or https, got ${scheme}:`;
  }
  return 'not an absolute http(s) URL';
}

/** Validates engine defaults; the error names the field. */
export function validateDefaults(d: HealthCheckDefaults): void {
  const problem = httpUrlProblem(d.url);
  if (problem) throw new Error(`health defaults.url: ${problem}`);
  const int = (name: string, v: number, min: number, max: number) => {
    if (!Number.isInteger(v) || v < min || v > max) {
      throw new Error(`health defaults.${name}: must be an integer in [${min}, ${max}], got ${v}`);
    }
  };
  int('expectStatus', d.expectStatus, 100, 599);
  int('intervalMs', d.intervalMs, 100, 3_600_000);
  int('failureThreshold', d.failureThreshold, 1, 1000);
  int('successThreshold', d.successThreshold, 1, 1000);
  if (d.timeoutMs !== undefined) int('timeoutMs', d.timeoutMs, 1, 3_600_000);
}

/**
 * `url` with the placeholder host `operator.invalid` (and any port written with it) replaced by
 * `operator`, the `host:port` the discovery API serves at; unchanged when it names another host
 * or the operator's address is not known (the API is off or on an ephemeral port): the
 * placeholder never resolves, so such probes fail visibly rather than reach something else.
 */
export function withOperatorAddress(url: string, operator: string | undefined): string {
  if (operator === undefined) return url;
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    return url;
  }
  if (u.hostname !== OPERATOR_PROBE_HOST) return url;
  u.host = operator;
  return u.href;
}

/** `operator`: where the discovery API serves (`127.0.0.1:8090`), for the placeholder URL. */
export function resolveCheck(
  defaults: HealthCheckDefaults,
  proxy: ProxyObject,
  operator?: string,
): ResolvedCheck {
  const hc = proxy.spec.healthCheck ?? {};
  const intervalMs = hc.intervalSeconds !== undefined ? hc.intervalSeconds * 1000 : defaults.intervalMs;
  const failureThreshold = hc.failureThreshold ?? defaults.failureThreshold;
  const timeoutMs =
    hc.timeoutSeconds !== undefined
      ? hc.timeoutSeconds * 1000
      : (defaults.timeoutMs ??
        Math.max(1, Math.min(5000, Math.floor((intervalMs * failureThreshold * 2) / 3))));
  const url = withOperatorAddress(hc.url ?? defaults.url, operator);
  return {
    url,
    shownUrl: redactUrl(url),
    expectStatus: hc.expectStatus ?? defaults.expectStatus,
    intervalMs,
    timeoutMs,
    failureThreshold,
    successThreshold: hc.successThreshold ?? defaults.successThreshold,
  };
}

/** FNV-1a: a stable, well-spread 32-bit hash of the UID. */
export function hash32(s: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < s.length; i++) {
    h ^= s.charCodeAt(i);
    h = Math.imul(h, 0x01000193);
  }
  // One extra avalanche round: UIDs share long prefixes.
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  return h >>> 0;
}

/** The proxy's fixed phase within every interval, in [0, intervalMs). */
export function scheduleOffset(uid: string, intervalMs: number): number {
  return Math.floor((hash32(uid) / 0x1_0000_0000) * intervalMs);
}

/** The first slot at or after `now`: slots are offset + k × interval from the epoch (no drift). */
export function nextSlot(now: number, offset: number, intervalMs: number): number {
  const k = Math.ceil((now - offset) / intervalMs);
  return offset + k * intervalMs;
}

export interface VerdictState {
  healthy: boolean | undefined;
  consecutiveSuccesses: number;
  consecutiveFailures: number;
  /**
   * A new instance (a replacement, a re-created lost instance, a new proxy): from Unknown it
   * needs the thresholds too — successThreshold passes before it is Healthy — instead of the
   * first result deciding at once.
   */
  gated?: boolean;
}

/**
 * Applies one counted probe result; returns the new verdict when it changed. The first result
 * decides at once, later ones need the thresholds (hysteresis against flapping).
 */
export function applyResult(
  s: VerdictState,
  ok: boolean,
  check: Pick<ResolvedCheck, 'failureThreshold' | 'successThreshold'>,
): boolean | undefined {
  if (ok) {
    s.consecutiveSuccesses++;
    s.consecutiveFailures = 0;
  } else {
    s.consecutiveFailures++;
    s.consecutiveSuccesses = 0;
  }
  let next = s.healthy;
  if (s.healthy === undefined && s.gated) {
    if (s.consecutiveSuccesses >= check.successThreshold) next = true;
    else if (s.consecutiveFailures >= check.failureThreshold) next = false;
  } else if (s.healthy === undefined) next = ok;
  else if (!s.healthy && s.consecutiveSuccesses >= check.successThreshold) next = true;
  else if (s.healthy && s.consecutiveFailures >= check.failureThreshold) next = false;
  if (next === s.healthy) return undefined;
  s.healthy = next;
  return next;
}

/** A latency change worth publishing: at least a factor 2 or 200 ms away from the last one. */
export function latencyMovedALot(previous: number | undefined, current: number): boolean {
  if (previous === undefined) return true;
  if (Math.abs(current - previous) >= 200) return true;
  if (previous === 0) return current >= 2;
  return current >= previous * 2 || current * 2 <= previous;
}
