/**
 * cmd/status — `egress-proxies-operator status`: a readable table of the proxies a running
 * operator knows, read from its discovery API (never credentials).
 */
import { DiscoveryClient } from '../discovery/client.ts';
import { normalizeTarget } from '../lease/target.ts';
import type { ProxySnapshot } from '../lease/types.ts';
import { errorMessage } from '../log/errors.ts';
import type { StatusFlags } from './flags.ts';

function ago(iso: string | null, now: number): string {
  if (!iso) return '-';
  const s = Math.max(0, Math.round((Date.parse(iso) - now) / 1000));
  if (s < 120) return `${s}s`;
  if (s < 7200) return `${Math.round(s / 60)}m`;
  return `${Math.round(s / 3600)}h`;
}

/** Problems only a person can fix, one line each under the table (messages are too long for a column). */
function problemLines(rows: ProxySnapshot[]): string[] {
  const lines = rows
    .filter((r) => r.problem)
    .map((r) => `  ${r.namespace}/${r.name}: ${r.problem?.reason}: ${r.problem?.message}`);
  return lines.length === 0 ? [] : ['', 'NEEDS ATTENTION', ...lines];
}

/** The closing line of `status --target`: what a crawler of that site can get right now. */
function targetLine(rows: ProxySnapshot[], target: string): string[] {
  const leasable = rows.filter((r) => r.leasable).length;
  const cooling = rows.filter((r) => r.reason === 'CoolingDownForTarget').length;
  return ['', `TARGET ${target}: ${leasable} of ${rows.length} leasable now, ${cooling} cooling down for it`];
}

/**
 * Pure: snapshot rows → aligned text table, then the proxies that need attention. With `target`
 * (normalised, as the API answers it) LEASABLE is for that site, COOLDOWNS shows only its own and
 * the global ones, and a last line sums up.
 */
export function formatStatusTable(rows: ProxySnapshot[], now = Date.now(), target?: string): string {
  const header = [
    'NAMESPACE',
    'NAME',
    'PHASE',
    'ADDRESS',
    'EGRESS IP',
    'HEALTHY',
    'LATENCY',
    'LEASES',
    'LEASABLE',
    'COOLDOWNS',
  ];
  const lines = rows.map((r) => {
    const cooldowns = [
      ...(r.cooldownUntil ? [`all ${ago(r.cooldownUntil, now)}`] : []),
      ...r.targetCooldowns
        .filter((c) => target === undefined || c.target === target)
        .map((c) => `${c.target} ${ago(c.until, now)}`),
    ];
    return [
      r.namespace,
      r.name,
      r.deleting ? 'Deleting' : r.phase,
      r.host && r.port ? `${r.host}:${r.port}` : '-',
      r.egressIP ?? '-',
      r.healthy ? 'yes' : 'no',
      r.latencyMillis === null ? '-' : `${r.latencyMillis}ms`,
      r.maxLeases > 0 ? `${r.activeLeases}/${r.maxLeases}` : String(r.activeLeases),
      r.leasable ? 'yes' : `no (${r.reason ?? 'unknown'})`,
      cooldowns.length > 0 ? cooldowns.join(', ') : '-',
    ];
  });
  const all = [header, ...lines];
  const widths = header.map((_, i) => Math.max(...all.map((row) => (row[i] ?? '').length)));
  const table = all.map((row) =>
    row
      .map((c, i) => c.padEnd(widths[i] ?? 0))
      .join('  ')
      .trimEnd(),
  );
  return [...table, ...problemLines(rows), ...(target ? targetLine(rows, target) : [])].join('\n');
}

export async function runStatus(flags: StatusFlags): Promise<number> {
  const client = new DiscoveryClient({
    baseUrl: flags.server,
    ...(flags.token ? { token: flags.token } : {}),
  });
  try {
    const rows = await client.listProxies(flags.target ? { target: flags.target } : {});
    if (flags.output === 'json') process.stdout.write(`${JSON.stringify(rows, null, 2)}\n`);
    else {
      const target = flags.target ? normalizeTarget(flags.target) : undefined;
      process.stdout.write(
        `${rows.length === 0 ? 'no proxies' : formatStatusTable(rows, Date.now(), target)}\n`,
      );
    }
    return 0;
  } catch (err) {
    process.stderr.write(`egress-proxies-operator status: ${flags.server}: ${errorMessage(err)}\n`);
    return 1;
  }
}
