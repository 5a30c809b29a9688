/**
 * dashboard/providers — the ProviderHealth objects as the dashboard shows them: the Ready
 * condition and one line per checked target (no provider-specific details).
 */
import { findCondition } from '../api/conditions.ts';
import type { ProviderHealth } from '../api/providerhealth.ts';
import type { ProviderSummary } from './web/types.ts';

export function providerSummaries(items: readonly ProviderHealth[]): ProviderSummary[] {
  return items
    .map((h): ProviderSummary => {
      const ready = findCondition(h.status?.conditions, 'Ready');
      return {
        name: h.metadata.name,
        type: h.status?.type ?? null,
        ready: ready ? ready.status === 'True' : null,
        reason: ready?.reason ?? null,
        targetsReady: h.status?.targetsReady ?? null,
        lastCheckTime: h.status?.lastCheckTime ?? null,
        targets: (h.status?.targets ?? []).map((t) => ({
          name: t.name,
          ready: t.ready,
          reason: t.reason,
          message: t.message ?? null,
          latencyMillis: t.latencyMillis ?? null,
        })),
      };
    })
    .sort((a, b) => (a.name < b.name ? -1 : 1));
}
