/**
 * provider/gcp/firewall — the managed ingress rule that opens a proxy port to the configured
 * source ranges only, for instances carrying the provider's network tag. One rule per port,
 * named after the tag and the port, so every Proxy on that port shares it.
 */
import { MANAGED_BY_VALUE } from '../../api/constants.ts';
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
