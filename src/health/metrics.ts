/**
 * health/metrics — the health engine's Prometheus series: probe duration and failures per
 * proxy (dropped with the proxy), and whether each probe URL answers directly.
 */
import type { Counter, Gauge, Histogram, Registry } from 'prom-client';
import { counter, gauge, histogram } from '../metrics/register.ts';

export interface HealthMetrics {
  duration: Histogram<'namespace' | 'proxy'>;
  failures: Counter<'namespace' | 'proxy' | 'reason'>;
  targetUp: Gauge<'url'>;
}

export function createHealthMetrics(registry: Registry): HealthMetrics {
  return {
    duration: histogram(registry, {
      name: 'proxy_operator_healthcheck_duration_seconds',
      help: 'Duration of health probes through each proxy (start to response headers, or to failure).',
      labelNames: ['namespace', 'proxy'],
      buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
    }),
    failures: counter(registry, {
      name: 'proxy_operator_healthcheck_failures_total',
      help: 'Failed health probes by reason (TargetDown: failed while the probe URL itself was down).',
      labelNames: ['namespace', 'proxy', 'reason'],
    }),
    targetUp: gauge(registry, {
      name: 'proxy_operator_healthcheck_target_up',
      help: 'Whether the probe URL answers when fetched directly, without a proxy (the control probe).',
      labelNames: ['url'],
    }),
  };
}
