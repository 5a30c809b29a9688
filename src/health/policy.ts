/**
 * health/policy — the pure rules of the health engine: which proxies are probed and where,
 * the effective check for a proxy (engine defaults + spec.healthCheck), the stable schedule
 * offset, the verdict state machine and when a latency change is worth reporting.
 */
import { DEFAULT_PROXY_PORT } from '../api/constants.ts';
import { type ProxyObject, phaseServes } from '../api/proxy.ts';

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
  url: 'https://www.gstatic.com/generate_204',
  expectStatus: 204,
  intervalMs: 1000,
  failureThreshold: 3,
  successThreshold: 1,
};

export interface ResolvedCheck {
  url: string;
  expectStatus: number;
  intervalMs: number;
  timeoutMs: number;
  failureThreshold: number;
  successThreshold: number;
}

/** Validates engine defaults; the error names the field. */
export function validateDefaults(d: HealthCheckDefaults): void {
  let url: URL;
  try {
    url = new URL(d.url);
  } catch {
    throw new Error(`health defaults.url: not a URL: ${JSON.stringify(d.url)}`);
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') {
    throw new Error(`health defaults.url: scheme must be http or https, got ${url.protocol}`);
  }
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

export function resolveCheck(defaults: HealthCheckDefaults, proxy: ProxyObject): ResolvedCheck {
  const hc = proxy.spec.healthCheck ?? {};
  const intervalMs = hc.intervalSeconds !== undefined ? hc.intervalSeconds * 1000 : defaults.intervalMs;
  const failureThreshold = hc.failureThreshold ?? defaults.failureThreshold;
  const timeoutMs =
    hc.timeoutSeconds !== undefined
      ? hc.timeoutSeconds * 1000
      : (defaults.timeoutMs ??
        Math.max(1, Math.min(5000, Math.floor((intervalMs * failureThreshold * 2) / 3))));
  return {
    url: hc.url ?? defaults.url,
    expectStatus: hc.expectStatus ?? defaults.expectStatus,
    intervalMs,
    timeoutMs,
    failureThreshold,
    successThreshold: hc.successThreshold ?? defaults.successThreshold,
  };
}

/** Where a proxy is reachable, or undefined when it is not to be probed. */
export function proxyAddress(proxy: ProxyObject): { host: string; port: number } | undefined {
  if (proxy.metadata.deletionTimestamp) return undefined;
  if ((proxy.spec.type ?? 'Managed') === 'External') {
    return proxy.spec.endpoint
      ? { host: proxy.spec.endpoint.host, port: proxy.spec.endpoint.port }
      : undefined;
  }
  const s = proxy.status;
  if (!phaseServes(s?.phase) || !s?.address) return undefined;
  return { host: s.address, port: s.port ?? proxy.spec.port ?? DEFAULT_PROXY_PORT };
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
  if (s.healthy === undefined) next = ok;
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
