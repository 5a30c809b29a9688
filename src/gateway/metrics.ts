/**
 * gateway/metrics — the gateway's Prometheus series (docs/operations.md): connections and
 * requests per upstream and outcome, bytes per upstream and direction, what upstreams
 * were reported, connections the gateway closed to protect its capacity, and response rules
 * that matched (rule names come from the providers config, so they stay bounded too). Upstream labels are `namespace/name` of fleet proxies, so they stay bounded by
 * the fleet; refusals before any upstream is chosen carry `upstream=""`.
 */
import type { Counter, Gauge, Registry } from 'prom-client';
import { counter, gauge } from '../metrics/register.ts';

/** How one gateway request or tunnel ended (the `result` label). */
export type GatewayResult =
  | 'ok'
  | 'blocked'
  | 'failed'
  | 'no_upstream'
  | 'denied'
  | 'unauthorized'
  | 'bad_request'
  | 'client_gone'
  /** Inspected HTTPS: the origin's certificate was refused (502 naming why). */
  | 'certificate_error';

export interface GatewayMetrics {
  requests: Counter<'kind' | 'upstream' | 'result'>;
  bytes: Counter<'upstream' | 'direction'>;
  reports: Counter<'upstream' | 'result'>;
  open: Gauge<'kind'>;
  /** Connections closed by the caps or the unauthenticated timeout, by `reason`. */
  shed: Counter<'reason'>;
  /** Response rules that matched, per rule, action and mode (enforce, observe). */
  ruleMatches: Counter<'rule' | 'action' | 'mode'>;
}

/** Why the gateway closed a connection it had not been asked to (the `reason` label). */
export type ShedReason = 'max_connections' | 'unauthenticated_cap' | 'unauthenticated_timeout';

export function gatewayMetrics(registry: Registry): GatewayMetrics {
  return {
    requests: counter(registry, {
      name: 'proxy_operator_gateway_requests_total',
      help: 'Gateway CONNECT tunnels and plain-HTTP requests by upstream and outcome',
      labelNames: ['kind', 'upstream', 'result'],
    }),
    bytes: counter(registry, {
      name: 'proxy_operator_gateway_bytes_total',
      help: 'Bytes the gateway carried per upstream: sent (client to upstream) and received',
      labelNames: ['upstream', 'direction'],
    }),
    reports: counter(registry, {
      name: 'proxy_operator_gateway_upstream_reports_total',
      help: 'Results the gateway reported to the lease store per upstream (blocked, failed)',
      labelNames: ['upstream', 'result'],
    }),
    open: gauge(registry, {
      name: 'proxy_operator_gateway_open',
      help: 'Gateway tunnels and plain-HTTP requests in flight',
      labelNames: ['kind'],
    }),
    shed: counter(registry, {
      name: 'proxy_operator_gateway_connections_closed_total',
      help: 'Connections the gateway closed itself: over --gateway-max-connections on accept, or unauthenticated over their own cap or past their deadline',
      labelNames: ['reason'],
    }),
    ruleMatches: counter(registry, {
      name: 'proxy_operator_gateway_rule_matches_total',
      help: 'Gateway response rules that matched an answer, once per action of the rule; mode=observe did nothing',
      labelNames: ['rule', 'action', 'mode'],
    }),
  };
}
