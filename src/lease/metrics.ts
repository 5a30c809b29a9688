/**
 * lease/metrics — the scrape-time gauge of active leases (see docs/operations.md), read from
 * the store when Prometheus scrapes rather than updated on every grant.
 */
import { Gauge, type Registry } from 'prom-client';
import type { LeaseStore } from './store.ts';

export function registerLeaseMetrics(registry: Registry, leases: LeaseStore): Gauge {
  return new Gauge({
    name: 'proxy_operator_leases_active',
    help: 'Leases currently held by clients of the discovery API.',
    registers: [registry],
    collect() {
      this.set(leases.activeLeases());
    },
  });
}
