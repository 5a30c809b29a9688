/**
 * provider/gcp/firewall — the managed ingress rule that opens a proxy port to the configured
 * source ranges only, for instances carrying the provider's network tag. One rule per port,
 * named after the tag and the port, so every Proxy on that port shares it; ensured once per
 * port and process (a failed ensure is retried on the next create).
 */
import type { Logger } from 'pino';
import { MANAGED_BY_VALUE } from '../../api/constants.ts';
import type { CallContext } from '../contract.ts';
import type { Clients } from './clients.ts';
import { parseError, raceSignal, toProviderError, type Where } from './errors.ts';
import type { GcpSettings } from './instance.ts';

export function firewallRuleName(targetTag: string, port: number): string {
  // Tag ≤ 63 by validation; keep the name ≤ 63 and ending alphanumeric.
  return `${targetTag.slice(0, 48).replace(/-+$/, '')}-tcp-${port}`;
}

export function buildFirewallRule(s: GcpSettings, port: number, sourceRanges: readonly string[]) {
  const network = s.network.includes('/') ? s.network : `global/networks/${s.network}`;
  return {
    name: firewallRuleName(s.targetTag, port),
    description: `Proxy port ${port} for instances tagged ${s.targetTag}, managed by ${MANAGED_BY_VALUE}`,
    network,
    direction: 'INGRESS',
    priority: 1000,
    allowed: [{ IPProtocol: 'tcp', ports: [String(port)] }],
    sourceRanges: [...sourceRanges],
    targetTags: [s.targetTag],
  };
}

/** Whether an existing rule already admits exactly what we would create. */
export function ruleMatches(
  existing: { sourceRanges?: string[] | null; targetTags?: string[] | null; allowed?: unknown },
  want: ReturnType<typeof buildFirewallRule>,
): boolean {
  const same = (a: readonly string[] | null | undefined, b: readonly string[]) =>
    [...(a ?? [])].sort().join(',') === [...b].sort().join(',');
  return same(existing.sourceRanges, want.sourceRanges) && same(existing.targetTags, want.targetTags);
}

export interface FirewallKeeperOptions {
  settings: GcpSettings;
  log: Logger;
  callOpts: () => { retry: null; timeout: number };
  where: (op: string, providerID?: string) => Where;
}

/** Creates the port's firewall rule unless it exists; once per port and process. */
export class FirewallKeeper {
  /** Firewall rules known to exist, by port. */
  private readonly ready = new Map<number, Promise<void>>();
  private readonly o: FirewallKeeperOptions;
  constructor(o: FirewallKeeperOptions) {
    this.o = o;
  }

  async ensure(ctx: CallContext, c: Clients, port: number): Promise<void> {
    const fw = this.o.settings.firewall;
    if (!fw) return;
    let ready = this.ready.get(port);
    if (!ready) {
      ready = this.create(ctx, c, port, fw.sourceRanges);
      this.ready.set(port, ready);
      ready.catch(() => this.ready.delete(port));
    }
    await raceSignal(ready, ctx.signal);
  }

  private async create(ctx: CallContext, c: Clients, port: number, ranges: string[]): Promise<void> {
    const rule = buildFirewallRule(this.o.settings, port, ranges);
    const project = this.o.settings.project;
    const where = this.o.where('create', `projects/${project}/global/firewalls/${rule.name}`);
    try {
      const [existing] = await raceSignal(
        () => c.firewalls().get({ project, firewall: rule.name }, this.o.callOpts()),
        ctx.signal,
      );
      if (!ruleMatches(existing, rule)) {
        this.o.log.warn(
          { firewall: rule.name, want: rule.sourceRanges },
          'gcp firewall rule exists with other source ranges or tags; leaving it as it is',
        );
      }
      return;
    } catch (err) {
      if (parseError(err).http !== 404) throw toProviderError(err, where, ctx.signal);
    }
    try {
      await raceSignal(
        () => c.firewalls().insert({ project, firewallResource: rule }, this.o.callOpts()),
        ctx.signal,
      );
      this.o.log.info(
        { firewall: rule.name, port, sourceRanges: rule.sourceRanges },
        'gcp firewall rule created',
      );
    } catch (err) {
      if (parseError(err).http !== 409) throw toProviderError(err, where, ctx.signal);
    }
  }
}
