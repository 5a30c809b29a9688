/**
 * lease/metrics — the scrape-time gauges of active leases and per-target cooldowns (see
 * docs/operations.md), read from the store when Prometheus scrapes rather than updated on every
 * grant; the ended leases kept for late reports (lease/ended) and their bytes; and the counts of
 * cooldowns and ended leases forgotten early for want of room.
 */
import type { Counter, Gauge, Registry } from 'prom-client';
import { collectedGauge, counter } from '../metrics/register.ts';
import type { LeaseStore } from './store.ts';

export function registerLeaseMetrics(registry: Registry, leases: LeaseStore): Gauge {
  const active = collectedGauge(registry, {
    name: 'proxy_operator_leases_active',
    help: 'Leases currently held by clients of the discovery API.',
    collect() {
      this.set(leases.activeLeases());
    },
  });
  collectedGauge(registry, {
    name: 'proxy_operator_lease_target_cooldowns',
    help: 'Per-target cooldown entries held (a blocked report adds one per proxy and target).',
    collect() {
      this.set(leases.targetCooldownCount());
    },
  });
  const holders = ['client', 'session'] as const;
  collectedGauge(registry, {
    name: 'proxy_operator_ended_leases',
    help: 'Ended leases still held for late reports, by who may report them (client: API clients, session: gateway sticky sessions).',
    labelNames: ['holder'] as const,
    collect() {
      const stats = leases.endedLeaseStats();
      for (const holder of holders) this.set({ holder }, stats[holder].leases);
    },
  });
  collectedGauge(registry, {
    name: 'proxy_operator_ended_lease_bytes',
    help: 'Bytes held by the ended leases kept for late reports, counted against their budget (--ended-lease-memory for holder=client).',
    labelNames: ['holder'] as const,
    collect() {
      const stats = leases.endedLeaseStats();
      for (const holder of holders) this.set({ holder }, stats[holder].bytes);
    },
  });
  return active;
}

/** Counts ended leases forgotten before their 15 minutes because their byte budget was full. */
export function endedLeaseEvictionCounter(registry: Registry): Counter<'holder'> {
  return counter(registry, {
    name: 'proxy_operator_ended_leases_evicted_total',
    help: 'Ended leases forgotten before their 15 minutes of late reports because the byte budget was full.',
    labelNames: ['holder'] as const,
  });
}

/** Counts per-target cooldowns forgotten early because the cap was reached (soonest-ending first). */
export function leaseEvictionCounter(registry: Registry): Counter {
  return counter(registry, {
    name: 'proxy_operator_lease_cooldowns_evicted_total',
    help: 'Per-target cooldowns evicted before their end because the cooldown cap was reached.',
  });
}
