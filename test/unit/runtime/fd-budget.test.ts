/**
 * Connection caps under the open-files limit: the limit as /proc/self/limits (or `ulimit -n`)
 * tells it, the pure plan that fits every listener's cap under it (a tunnel counted twice, room
 * kept for files), and what the process says at start about the limit and the caps it chose.
 */
import { describe, expect, it } from 'vitest';
import { capDemands, fitConnectionCaps } from '../../../src/cmd/caps.ts';
import { parseCommandLine, type StandaloneFlags } from '../../../src/cmd/flags.ts';
import {
  type CapDemand,
  LOW_FD_LIMIT,
  parseProcLimits,
  planConnectionCaps,
  readFdLimit,
  reservedFds,
} from '../../../src/runtime/fd-budget.ts';
import { captureLog } from '../../support/log.ts';

const PROC_LIMITS = `Limit                     Soft Limit           Hard Limit           Units
Max cpu time              unlimited            unlimited            seconds
Max open files            1024                 524288               files
Max locked memory         8388608              8388608              bytes
`;

describe('the open-files limit', () => {
  it('is the soft limit of "Max open files"; unlimited is Infinity', () => {
    expect(parseProcLimits(PROC_LIMITS)).toBe(1024);
    expect(parseProcLimits(PROC_LIMITS.replace(/1024 {17}/, 'unlimited            '))).toBe(
      Number.POSITIVE_INFINITY,
    );
    expect(parseProcLimits('Max cpu time unlimited unlimited seconds\n')).toBeUndefined();
  });

  it('comes from /proc/self/limits, else from `ulimit -n`, else is unknown', () => {
    const broken = () => {
      throw new Error('ENOENT');
    };
    expect(readFdLimit({ readProcLimits: () => PROC_LIMITS, ulimit: broken })).toEqual({
      limit: 1024,
      source: '/proc/self/limits',
    });
    expect(readFdLimit({ readProcLimits: broken, ulimit: () => '4096\n' })).toEqual({
      limit: 4096,
      source: 'ulimit -n',
    });
    expect(readFdLimit({ readProcLimits: broken, ulimit: broken })).toEqual({
      limit: undefined,
      source: 'unknown',
    });
  });

  it('is read from this process for real (Linux)', () => {
    const fd = readFdLimit();
    expect(fd.source).toBe('/proc/self/limits');
    expect(fd.limit).toBeGreaterThan(0);
  });
});

const DEMANDS: CapDemand[] = [
  { name: 'gateway', demand: 20_000, fdsPerConnection: 2, share: 4 },
  { name: 'discovery', demand: 1024, fdsPerConnection: 1, share: 2 },
  { name: 'localProxies', demand: 4096, fdsPerConnection: 2, share: 2 },
  { name: 'probes', demand: 16, fdsPerConnection: 1, share: 1 },
];

/** Descriptors the caps of `plan` can hold at once. */
function fdsOf(caps: Record<string, number>, demands = DEMANDS): number {
  return demands.reduce((n, d) => n + (caps[d.name] ?? 0) * d.fdsPerConnection, 0);
}

describe('planConnectionCaps', () => {
  it('keeps every demand when they fit with room to spare', () => {
    const plan = planConnectionCaps(1_048_576, DEMANDS);
    expect(plan.caps).toEqual({ gateway: 20_000, discovery: 1024, localProxies: 4096, probes: 16 });
    expect(plan.clamped).toEqual([]);
  });

  it('keeps every demand when the limit is unknown or unlimited', () => {
    for (const limit of [undefined, Number.POSITIVE_INFINITY]) {
      expect(planConnectionCaps(limit, DEMANDS).caps.gateway).toBe(20_000);
    }
  });

  it.each([1024, 4096, 20_000, 65_536])('under a limit of %i, the caps and the reserve fit', (limit) => {
    const plan = planConnectionCaps(limit, DEMANDS);
    expect(fdsOf(plan.caps) + plan.reserved).toBeLessThanOrEqual(limit);
    expect(plan.reserved).toBe(reservedFds(limit));
    expect(plan.reserved).toBeGreaterThanOrEqual(256);
    // The small probe port keeps what it asks for; the big listeners share by weight, the
    // gateway holding the most descriptors.
    expect(plan.caps.probes).toBe(16);
    expect((plan.caps.gateway as number) * 2).toBeGreaterThan(plan.caps.discovery as number);
    for (const c of Object.values(plan.caps)) expect(c).toBeGreaterThanOrEqual(1);
  });

  it('1024 (a common supervisor default): the gateway gets a few hundred, counted twice', () => {
    const plan = planConnectionCaps(1024, DEMANDS);
    expect(plan.reserved).toBe(256);
    expect(plan.caps.gateway).toBeGreaterThanOrEqual(150);
    expect(plan.caps.gateway).toBeLessThan(384); // (1024 - 256) / 2
    expect(plan.clamped.map((c) => c.name).sort()).toEqual(['discovery', 'gateway', 'localProxies']);
  });

  it('a listener asking for less than its share gets it, and the rest goes to the others', () => {
    const plan = planConnectionCaps(20_000, DEMANDS);
    expect(plan.caps.discovery).toBe(1024);
    const budget = 20_000 - plan.reserved;
    expect(fdsOf(plan.caps)).toBeGreaterThan(budget - 10);
  });

  it('names the flag of a clamped demand that came from one', () => {
    const plan = planConnectionCaps(2048, [
      { name: 'gateway', demand: 50_000, fdsPerConnection: 2, share: 4, flag: '--gateway-max-connections' },
    ]);
    expect(plan.clamped).toEqual([
      { name: 'gateway', flag: '--gateway-max-connections', demand: 50_000, cap: (2048 - 256) / 2 },
    ]);
  });

  it('never gives a cap below 1, however low the limit', () => {
    const plan = planConnectionCaps(64, DEMANDS);
    for (const c of Object.values(plan.caps)) expect(c).toBeGreaterThanOrEqual(1);
  });
});

function standalone(args: string[] = []): StandaloneFlags {
  const parsed = parseCommandLine(['standalone', '--config', 'x', ...args]);
  if (parsed.command !== 'standalone') throw new Error('not standalone');
  return parsed.flags;
}

describe('the caps a process starts with', () => {
  it('asks only for the listeners it runs, the gateway and local proxies at 2 descriptors each', () => {
    const names = (f: StandaloneFlags, local: boolean) => capDemands(f, local).map((d) => d.name);
    expect(names(standalone(), true)).toEqual(['gateway', 'discovery', 'localProxies', 'probes']);
    expect(
      names(standalone(['--gateway-bind-address', '0', '--metrics-bind-address', ':9090']), false),
    ).toEqual(['discovery', 'metrics', 'probes']);
    const gateway = capDemands(standalone(), false)[0];
    expect(gateway).toMatchObject({ name: 'gateway', demand: 20_000, fdsPerConnection: 2 });
    expect(gateway?.flag).toBeUndefined();
  });

  it('a low limit: one warning naming the limit and the caps chosen', () => {
    const { log, lines } = captureLog();
    const flags = fitConnectionCaps(standalone(), true, { limit: 1024, source: '/proc/self/limits' }, log);
    expect(flags.gateway.maxConnections).toBeLessThan(384);
    expect(flags.discoveryLimits.maxConnections).toBeLessThan(1024);
    expect(flags.localProxiesMaxConnections).toBeLessThan(4096);
    expect(flags.healthProbeMaxConnections).toBe(16);
    const warnings = lines.filter((l) => l.level === 40);
    expect(warnings).toHaveLength(1);
    expect(String(warnings[0]?.msg)).toMatch(/open-files limit is low \(1024\).*gateway \d+/);
    expect(1024).toBeLessThan(LOW_FD_LIMIT);
  });

  it('a flag above what the limit allows: lowered, with a warning naming the flag', () => {
    const { log, lines } = captureLog();
    const flags = fitConnectionCaps(
      standalone(['--gateway-max-connections', '30000', '--discovery-max-connections', '100']),
      false,
      { limit: 20_000, source: '/proc/self/limits' },
      log,
    );
    expect(flags.gateway.maxConnections).toBeLessThan(10_000);
    expect(flags.discoveryLimits.maxConnections).toBe(100);
    const warned = lines.filter((l) => l.level === 40).map((l) => String(l.msg));
    expect(warned).toEqual([expect.stringMatching(/^--gateway-max-connections=30000 exceeds .* \(20000\)/)]);
    expect(lines.some((l) => l.level === 30 && String(l.msg).startsWith('open-files limit 20000'))).toBe(
      true,
    );
  });

  it('a generous limit: every cap as configured, one info line', () => {
    const { log, lines } = captureLog();
    const flags = fitConnectionCaps(
      standalone(),
      true,
      { limit: 1_048_576, source: '/proc/self/limits' },
      log,
    );
    expect(flags.gateway.maxConnections).toBe(20_000);
    expect(lines.filter((l) => (l.level as number) >= 40)).toEqual([]);
  });

  it('an unknown limit: caps as configured, and a warning that it is unknown', () => {
    const { log, lines } = captureLog();
    const flags = fitConnectionCaps(standalone(), true, { limit: undefined, source: 'unknown' }, log);
    expect(flags.gateway.maxConnections).toBe(20_000);
    expect(lines.filter((l) => l.level === 40).map((l) => l.msg)).toEqual([
      'open-files limit unknown: connection caps left as configured',
    ]);
  });
});
