/**
 * health/probed-instance — what the engine knows about one probed proxy, and how one counted probe
 * result moves its verdict. Scheduling, credentials and status writes keep their own state in
 * their own modules; this record holds only the probe history and the verdict.
 */
import { applyResult, REASON_PROBE_SUCCEEDED, type ResolvedCheck, type VerdictState } from './policy.ts';
import type { ProbeResult } from './probe.ts';

export interface HealthVerdict {
  /** `namespace/name`. */
  key: string;
  uid: string;
  healthy: boolean;
  latencyMillis?: number;
  /** Probe reason of the failure that made it unhealthy. */
  reason?: string;
}

/** The last counted probe (a frozen failure is not counted). */
export interface LastProbe {
  reason?: string;
  message?: string;
  /** Of the last success. */
  latencyMs?: number;
  /** Clock ms. */
  time?: number;
}

/** `serving`: the instance at status.address, leased; `replacement`: status.pending, not leased yet. */
export type InstanceRole = 'serving' | 'replacement';

export interface ProbedInstance {
  /** The scheduler key: `namespace/name`, or with `#replacement` for the pending instance. */
  readonly key: string;
  /** `namespace/name` of the Proxy. */
  readonly proxyKey: string;
  readonly role: InstanceRole;
  /** providerID of the probed instance ('' for External proxies). */
  readonly instance: string;
  /** Credentials generation the instance serves (api/served-credentials), when known. */
  generation: number | undefined;
  readonly uid: string;
  readonly namespace: string;
  readonly name: string;
  host: string;
  port: number;
  check: ResolvedCheck;
  /** The control probe this instance's check shares (health/control). */
  controlKey: string;
  verdict: VerdictState;
  last: LastProbe;
  /** Latency last handed to the listener. */
  latencyReported?: number;
  /** What the status writer persisted of this instance. */
  status: StatusRecord;
  histogram: { observe(v: number): void };
  /** Failure reasons counted for this proxy, to drop their series with it. */
  failureReasons: Set<string>;
}

export interface NewProbedInstance {
  key: string;
  proxyKey: string;
  role: InstanceRole;
  instance: string;
  generation: number | undefined;
  /** Verdict needs the thresholds from Unknown (see policy VerdictState.gated). */
  gated: boolean;
  uid: string;
  namespace: string;
  name: string;
  host: string;
  port: number;
  check: ResolvedCheck;
  controlKey: string;
  /** status.health.latencyMillis as stored, so a restart does not rewrite an unchanged value. */
  storedLatency: number | undefined;
  histogram: ProbedInstance['histogram'];
}

export function newProbedInstance(n: NewProbedInstance): ProbedInstance {
  return {
    key: n.key,
    proxyKey: n.proxyKey,
    role: n.role,
    instance: n.instance,
    generation: n.generation,
    uid: n.uid,
    namespace: n.namespace,
    name: n.name,
    host: n.host,
    port: n.port,
    check: n.check,
    controlKey: n.controlKey,
    verdict: { healthy: undefined, consecutiveSuccesses: 0, consecutiveFailures: 0, gated: n.gated },
    last: {},
    status: newStatusRecord(n.storedLatency),
    histogram: n.histogram,
    failureReasons: new Set(),
  };
}

/** Counts one probe result at `now`; returns the new verdict when it changed. */
export function recordResult(t: ProbedInstance, r: ProbeResult, now: number): boolean | undefined {
  t.last.time = now;
  if (r.ok) {
    t.last.latencyMs = r.latencyMs;
    t.last.reason = REASON_PROBE_SUCCEEDED;
    t.last.message = `probe of ${t.check.shownUrl} answered ${t.check.expectStatus} in ${r.latencyMs} ms`;
  } else {
    t.last.reason = r.reason;
    t.last.message = r.message;
  }
  return applyResult(t.verdict, r.ok, t.check);
}

export function verdictOf(t: ProbedInstance): HealthVerdict {
  const healthy = t.verdict.healthy === true;
  const v: HealthVerdict = { key: t.proxyKey, uid: t.uid, healthy };
  if (healthy && t.last.latencyMs !== undefined) v.latencyMillis = t.last.latencyMs;
  if (!healthy && t.last.reason) v.reason = t.last.reason;
  return v;
}

/** What has been persisted of one probed instance. */
export interface StatusRecord {
  /** Verdict transitions so far, and the one last persisted. */
  version: number;
  writtenVersion: number;
  /** status.health.latencyMillis as last written (or found at start), and when. */
  latencyWritten: number | undefined;
  latencyWrittenAt: number;
  /** A latency change is waiting to be written. */
  latencyDirty: boolean;
}

export function newStatusRecord(storedLatency: number | undefined): StatusRecord {
  return {
    version: 0,
    writtenVersion: 0,
    latencyWritten: storedLatency,
    latencyWrittenAt: Number.NEGATIVE_INFINITY,
    latencyDirty: false,
  };
}
