/**
 * gateway/context — what the gateway's CONNECT and plain-HTTP paths share: the upstream
 * chooser, the egress guard, metrics, tracing, limits, and the registry of open connections
 * whose leases are renewed while they last.
 */
import type { Tracer } from '@opentelemetry/api';
import type { Logger } from 'pino';
import type { EgressGuard } from '../provider/local/egress.ts';
import type { GatewayMetrics } from './metrics.ts';
import type { Acquired, UpstreamChooser } from './upstreams.ts';

export const EGRESS_PROXY_HEADER = 'X-Egress-Proxy';
/** Plain-HTTP answers that mean "this site blocks this upstream" unless configured otherwise. */
export const DEFAULT_BLOCKED_STATUSES: readonly number[] = [403, 429];

export interface GatewayLimits {
  headersTimeoutMs: number;
  requestTimeoutMs: number;
  /** A tunnel or keep-alive connection without traffic for this long is closed. */
  idleTimeoutMs: number;
  maxConnections: number;
  /** Connect plus the upstream's answer; longer counts as the upstream failing. */
  upstreamTimeoutMs: number;
}

export const DEFAULT_GATEWAY_LIMITS: GatewayLimits = {
  headersTimeoutMs: 10_000,
  requestTimeoutMs: 60_000,
  idleTimeoutMs: 120_000,
  maxConnections: 20_000,
  upstreamTimeoutMs: 10_000,
};

export interface GatewayContext {
  chooser: UpstreamChooser;
  egress: EgressGuard;
  metrics: GatewayMetrics;
  tracer: Tracer;
  log: Logger;
  limits: GatewayLimits;
  blockedStatuses: ReadonlySet<number>;
  /** Registers an open connection's lease for renewal; `cut` ends the connection if renewal is refused. */
  hold(a: Acquired, cut: () => void): void;
  /** The connection ended: stop renewing, release the lease. */
  letGo(a: Acquired): void;
}
