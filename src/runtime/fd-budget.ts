/**
 * runtime/fd-budget — the connection caps of every listener, derived from the file-descriptor
 * limit the process really has (docs/operations.md, "Connection caps and the file-descriptor
 * limit"). A cap above what the process can open makes the process fail at accept(), open(),
 * connect() alike (EMFILE) long before the cap is reached: the state journal and the
 * checkpoint could no longer be written. So the caps are set below the limit, with room kept
 * for files, the journal and outgoing API clients, and a gateway tunnel counted twice (the
 * client's socket and the upstream's).
 */
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';

export interface FdLimit {
  /** The soft RLIMIT_NOFILE of this process; Infinity when unlimited; undefined when unknown. */
  limit: number | undefined;
  /** Where it was read: `/proc/self/limits`, `ulimit -n`, or `unknown`. */
  source: string;
}

/** "Max open files" of a /proc/<pid>/limits text: its soft limit (Infinity for unlimited). */
export function parseProcLimits(text: string): number | undefined {
  const m = /^Max open files\s+(\S+)\s+\S+/m.exec(text);
  if (!m) return undefined;
  return parseLimitValue(m[1] as string);
}

function parseLimitValue(v: string): number | undefined {
  if (v === 'unlimited') return Number.POSITIVE_INFINITY;
  return /^\d+$/.test(v) ? Number(v) : undefined;
}

export interface FdLimitSources {
  readProcLimits(): string;
  ulimit(): string;
}

const SYSTEM_SOURCES: FdLimitSources = {
  readProcLimits: () => readFileSync('/proc/self/limits', 'utf8'),
  // A child inherits this process's limits, so its `ulimit -n` is ours (used where /proc is not).
  ulimit: () => execFileSync('sh', ['-c', 'ulimit -n'], { encoding: 'utf8', timeout: 2_000 }),
};

/**
 * The soft open-files limit this process has now. Read after start-up on purpose: Node raises
 * its soft limit to the hard limit when it starts, so the `ulimit -n` a shell showed before is
 * not what the process has; /proc/self/limits (Linux) is, and a child's `ulimit -n` elsewhere.
 */
export function readFdLimit(sources: FdLimitSources = SYSTEM_SOURCES): FdLimit {
  try {
    const limit = parseProcLimits(sources.readProcLimits());
    if (limit !== undefined) return { limit, source: '/proc/self/limits' };
  } catch {
    // not Linux, or /proc not mounted: ask a shell
  }
  try {
    const limit = parseLimitValue(sources.ulimit().trim());
    if (limit !== undefined) return { limit, source: 'ulimit -n' };
  } catch {
    // no shell either
  }
  return { limit: undefined, source: 'unknown' };
}

/** One listener asking for connections. */
export interface CapDemand {
  name: string;
  /** Connections wanted: the flag's value, else the default. */
  demand: number;
  /** Set when `demand` came from this flag: clamping it is warned about by name. */
  flag?: string;
  /** Descriptors one connection holds: 2 for a proxied connection (client and upstream/origin). */
  fdsPerConnection: number;
  /** Relative weight when the budget is short. */
  share: number;
}

export interface CapPlan {
  /** Connections allowed per listener name. */
  caps: Record<string, number>;
  /** Descriptors kept free for files, the journal, outgoing clients, the runtime. */
  reserved: number;
  /** Listeners whose cap is below their demand. */
  clamped: { name: string; flag?: string; demand: number; cap: number }[];
}

/** Below this the limit is called low at start (a busy gateway alone wants more). */
export const LOW_FD_LIMIT = 4096;

/** Descriptors not for listeners: 5 % of the limit, at least 256, at most half of it. */
export function reservedFds(limit: number): number {
  return Math.min(Math.floor(limit / 2), Math.max(256, Math.floor(limit * 0.05)));
}

/**
 * Caps for `demands` under `limit`: every demand as asked when their descriptors together fit
 * in the limit minus the reserve; otherwise the budget is shared by weight, a listener asking
 * for less than its share getting what it asks and the rest shared again among the others
 * (so the probe port keeps its few connections while the gateway and the API share the
 * remainder). Every cap is at least 1. Pure.
 */
export function planConnectionCaps(limit: number | undefined, demands: readonly CapDemand[]): CapPlan {
  const caps: Record<string, number> = {};
  if (limit === undefined || !Number.isFinite(limit)) {
    for (const d of demands) caps[d.name] = d.demand;
    return { caps, reserved: 0, clamped: [] };
  }
  const reserved = reservedFds(limit);
  let budget = Math.max(0, limit - reserved);
  let open = [...demands];
  for (;;) {
    const shares = open.reduce((s, d) => s + d.share, 0);
    const satisfied = open.filter((d) => d.demand * d.fdsPerConnection <= (budget * d.share) / shares);
    if (satisfied.length === 0) break;
    for (const d of satisfied) {
      caps[d.name] = d.demand;
      budget -= d.demand * d.fdsPerConnection;
    }
    open = open.filter((d) => !satisfied.includes(d));
    if (open.length === 0) break;
  }
  const shares = open.reduce((s, d) => s + d.share, 0);
  for (const d of open) {
    caps[d.name] = Math.max(1, Math.floor((budget * d.share) / shares / d.fdsPerConnection));
  }
  const clamped = demands
    .filter((d) => (caps[d.name] as number) < d.demand)
    .map((d) => ({
      name: d.name,
      ...(d.flag === undefined ? {} : { flag: d.flag }),
      demand: d.demand,
      cap: caps[d.name] as number,
    }));
  return { caps, reserved, clamped };
}
