/**
 * lease/metrics — the scrape-time gauge of active leases (see docs/operations.md), read from
 * the store when Prometheus scrapes rather than updated on every grant.
 */
import type { Gauge, Registry } from 'prom-client';
import { collectedGauge } from '../metrics/register.ts';
import type { LeaseStore } from './store.ts';

export function registerLeaseMetrics(registry: Registry, leases: LeaseStore): Gauge {
  return collectedGauge(registry, {
    name: 'proxy_operator_leases_active',
    help: 'Leases currently held by clients of the discovery API.',
    collect() {
      this.set(leases.activeLeases());
    },
  });
}
