/**
 * cmd/caps — the connection caps a process starts with: what each listener asks for (flags or
 * defaults), fitted under the file-descriptor limit the process really has (runtime/fd-budget),
 * and said at start: one line naming the limit and the caps, a warning when the limit is low,
 * one more naming each cap flag that had to be lowered.
 */
import type { Logger } from '../log/index.ts';
import { parseBindAddress } from '../metrics/bind.ts';
import { type CapDemand, type FdLimit, LOW_FD_LIMIT, planConnectionCaps } from '../runtime/fd-budget.ts';
import type { CommonFlags } from './flags.ts';

type CapFlags = Pick<
  CommonFlags,
  | 'gateway'
  | 'discoveryBindAddress'
  | 'discoveryLimits'
  | 'metricsBindAddress'
  | 'metricsLimits'
  | 'healthProbeBindAddress'
  | 'healthProbeMaxConnections'
  | 'localProxiesMaxConnections'
  | 'explicitCaps'
>;

const enabled = (bind: string) => parseBindAddress(bind, 'bind address') !== null;

/**
 * The listeners this process will run and what each asks for. Weights when the budget is
 * short: the gateway (internet-facing, two descriptors a tunnel) most, then the lease API and
 * the local proxies; the metrics and probe ports ask for little and get it. Pure.
 */
export function capDemands<F extends CapFlags>(flags: F, hasLocalProxies: boolean): CapDemand[] {
  const flag = (name: string) => (flags.explicitCaps.includes(name) ? { flag: `--${name}` } : {});
  const out: CapDemand[] = [];
  if (enabled(flags.gateway.bindAddress)) {
    out.push({
      name: 'gateway',
      demand: flags.gateway.maxConnections,
      fdsPerConnection: 2,
      share: 4,
      ...flag('gateway-max-connections'),
    });
  }
  if (enabled(flags.discoveryBindAddress)) {
    out.push({
      name: 'discovery',
      demand: flags.discoveryLimits.maxConnections,
      fdsPerConnection: 1,
      share: 2,
      ...flag('discovery-max-connections'),
    });
  }
  if (hasLocalProxies) {
    out.push({
      name: 'localProxies',
      demand: flags.localProxiesMaxConnections,
      fdsPerConnection: 2,
      share: 2,
    });
  }
  if (enabled(flags.metricsBindAddress)) {
    out.push({
      name: 'metrics',
      demand: flags.metricsLimits.maxConnections,
      fdsPerConnection: 1,
      share: 1,
      ...flag('metrics-max-connections'),
    });
  }
  if (enabled(flags.healthProbeBindAddress)) {
    out.push({ name: 'probes', demand: flags.healthProbeMaxConnections, fdsPerConnection: 1, share: 1 });
  }
  return out;
}

/** `flags` with every connection cap fitted under `fd.limit`; logs what it chose. */
export function fitConnectionCaps<F extends CapFlags>(
  flags: F,
  hasLocalProxies: boolean,
  fd: FdLimit,
  log: Logger,
): F {
  const plan = planConnectionCaps(fd.limit, capDemands(flags, hasLocalProxies));
  const cap = (name: string, fallback: number) => plan.caps[name] ?? fallback;
  const fitted: F = {
    ...flags,
    gateway: { ...flags.gateway, maxConnections: cap('gateway', flags.gateway.maxConnections) },
    discoveryLimits: {
      ...flags.discoveryLimits,
      maxConnections: cap('discovery', flags.discoveryLimits.maxConnections),
    },
    metricsLimits: {
      ...flags.metricsLimits,
      maxConnections: cap('metrics', flags.metricsLimits.maxConnections),
    },
    healthProbeMaxConnections: cap('probes', flags.healthProbeMaxConnections),
    localProxiesMaxConnections: cap('localProxies', flags.localProxiesMaxConnections),
  };
  const fields = {
    fdLimit: fd.limit === undefined ? 'unknown' : String(fd.limit),
    fdLimitSource: fd.source,
    reservedFds: plan.reserved,
    caps: plan.caps,
  };
  if (fd.limit === undefined) {
    log.warn(fields, 'open-files limit unknown: connection caps left as configured');
  } else if (fd.limit < LOW_FD_LIMIT) {
    log.warn(
      fields,
      `open-files limit is low (${fd.limit}): connection caps lowered to fit (${describe(plan.caps)}); raise the limit (docs/operations.md)`,
    );
  } else {
    log.info(fields, `open-files limit ${fd.limit}: connection caps ${describe(plan.caps)}`);
  }
  for (const c of plan.clamped) {
    if (c.flag === undefined) continue;
    log.warn(
      { flag: c.flag, requested: c.demand, cap: c.cap, fdLimit: fd.limit },
      `${c.flag}=${c.demand} exceeds what the open-files limit (${fd.limit}) allows: using ${c.cap}`,
    );
  }
  return fitted;
}

function describe(caps: Record<string, number>): string {
  return Object.entries(caps)
    .map(([k, v]) => `${k} ${v}`)
    .join(', ');
}
