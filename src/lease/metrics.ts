/**
 * lease/metrics — the scrape-time gauges of active leases and per-target cooldowns (see
 * docs/operations.md), read from the store when Prometheus scrapes rather than updated on every
 * grant, and the count of cooldowns the cap evicted.
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
  return active;
}

/** Counts per-target cooldowns forgotten early because the cap was reached (soonest-ending first). */
export function leaseEvictionCounter(registry: Registry): Counter {
  return counter(registry, {
    name: 'proxy_operator_lease_cooldowns_evicted_total',
    help: 'Per-target cooldowns evicted before their end because the cooldown cap was reached.',
  });
}
