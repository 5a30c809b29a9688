/**
 * providerhealth/stranded — Proxies that name a provider the providers config no longer has
 * (renamed or removed). The reconciler can only mark them Failed; this module says so where an
 * operator looks: a ProviderHealth per missing provider, the start-up warning and /readyz.
 */
import { setCondition } from '../api/conditions.ts';
import { CONDITION_READY, PROVISIONED_REASONS } from '../api/constants.ts';
import { keyOf } from '../api/meta.ts';
import type { ProviderHealthStatus } from '../api/providerhealth.ts';
import { type ProxyObject, proxyType } from '../api/proxy.ts';

/** A provider named by Proxies but absent from the providers config. */
export interface StrandedProvider {
  provider: string;
  /** `namespace/name` of each Proxy naming it, sorted. */
  proxies: string[];
}

/** Managed Proxies grouped by the unconfigured provider they name, by provider name. */
export function strandedProviders(
  proxies: readonly ProxyObject[],
  configured: ReadonlySet<string>,
): StrandedProvider[] {
  const by = new Map<string, string[]>();
  for (const p of proxies) {
    if (proxyType(p.spec) !== 'Managed') continue;
    const name = p.spec.provider ?? '';
    if (configured.has(name)) continue;
    const list = by.get(name) ?? [];
    list.push(keyOf(p));
    by.set(name, list);
  }
  return [...by]
    .sort(([a], [b]) => a.localeCompare(b))
    .map(([provider, keys]) => ({ provider, proxies: keys.sort() }));
}

const SHOWN = 5;

/** One sentence for logs, /readyz and the ProviderHealth condition. */
export function strandedMessage(s: StrandedProvider): string {
  const shown = s.proxies.slice(0, SHOWN).join(', ');
  const more = s.proxies.length > SHOWN ? ` and ${s.proxies.length - SHOWN} more` : '';
  return (
    `provider "${s.provider}" is not in the providers config but ${s.proxies.length} Proxy(s) use it ` +
    `(${shown}${more}); they stay Failed until it is configured again or they name another provider`
  );
}

/** The ProviderHealth status of a missing provider: not ready, with who depends on it. */
export function strandedStatus(
  prev: ProviderHealthStatus | undefined,
  s: StrandedProvider,
  now: Date,
): ProviderHealthStatus {
  return {
    conditions: setCondition(
      prev?.conditions,
      {
        type: CONDITION_READY,
        status: 'False',
        reason: PROVISIONED_REASONS.providerNotConfigured,
        message: strandedMessage(s),
      },
      now,
    ),
    targets: [],
    lastCheckTime: now.toISOString(),
  };
}

/**
 * The /readyz verdict: a note while part of the fleet is stranded (the replica still serves
 * every other Proxy, and being unready would stop that too); a failure once every Proxy is,
 * since nothing is left to serve.
 */
export function strandedReadiness(
  proxies: readonly ProxyObject[],
  configured: ReadonlySet<string>,
): string | undefined {
  const stranded = strandedProviders(proxies, configured);
  if (stranded.length === 0) return undefined;
  const count = stranded.reduce((n, s) => n + s.proxies.length, 0);
  const text = stranded
    .map((s) => `${s.proxies.length} Proxy(s) use unconfigured provider "${s.provider}"`)
    .join('; ');
  if (count === proxies.length) throw new Error(`every Proxy is stranded: ${text}`);
  return text;
}
