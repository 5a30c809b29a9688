/**
 * gateway/context — what the gateway's CONNECT and plain-HTTP paths share: the upstream
 * chooser, the egress guard, the response rules, metrics, tracing, limits, and the registry of
 * open connections whose leases are renewed while they last.
 */

import type { Tracer } from '@opentelemetry/api';
import type { Logger } from 'pino';
import type { EgressGuard } from '../provider/local/egress.ts';
import type { Clock } from '../runtime/clock.ts';
import type { ConnectionPool } from './http1.ts';
import type { GatewayMetrics } from './metrics.ts';
import type { Rule } from './rules.ts';
import type { Acquired, UpstreamChooser } from './upstreams.ts';

export const EGRESS_PROXY_HEADER = 'X-Egress-Proxy';

export interface GatewayLimits {
  headersTimeoutMs: number;
  requestTimeoutMs: number;
  /** A tunnel or keep-alive connection without traffic for this long is closed. */
  idleTimeoutMs: number;
  /** Open connections at most; more are closed on accept. */
  maxConnections: number;
  /**
   * Of those, connections that have not yet sent a request with valid credentials (every new
   * connection, until its first authenticated request or CONNECT): when this many are open, the
   * oldest of them is closed for each new one (docs/gateway.md, "Unauthenticated connections").
   * Default: an eighth of `maxConnections`, at most 1024.
   */
  unauthenticatedMaxConnections: number;
  /** An unauthenticated connection is closed this long after it was accepted. */
  unauthenticatedTimeoutMs: number;
  /** Connect plus the upstream's answer; longer counts as the upstream failing. */
  upstreamTimeoutMs: number;
}

/** The default unauthenticated cap's ceiling, whatever the gateway's cap. */
export const MAX_UNAUTHENTICATED_CONNECTIONS = 1024;

/**
 * The default cap for connections that have not authenticated yet: an eighth of the gateway's,
 * so a flood without credentials leaves the rest to clients that authenticate, and at most
 * 1024, because what those connections cost at their peak (10-20 KB of native and heap memory
 * each) stays with the process after they close. A client is unauthenticated only for the
 * round trip of its first request, so 1024 at once still admits thousands a second.
 */
export function unauthenticatedCap(maxConnections: number): number {
  return Math.max(1, Math.min(MAX_UNAUTHENTICATED_CONNECTIONS, Math.floor(maxConnections / 8)));
}

export const DEFAULT_GATEWAY_LIMITS: GatewayLimits = {
  headersTimeoutMs: 10_000,
  requestTimeoutMs: 60_000,
  idleTimeoutMs: 120_000,
  maxConnections: 20_000,
  unauthenticatedMaxConnections: unauthenticatedCap(20_000),
  unauthenticatedTimeoutMs: 10_000,
  upstreamTimeoutMs: 10_000,
};

/** `limits` over the defaults; the unauthenticated cap follows `maxConnections` unless given. */
export function gatewayLimits(limits: Partial<GatewayLimits> = {}): GatewayLimits {
  const maxConnections = limits.maxConnections ?? DEFAULT_GATEWAY_LIMITS.maxConnections;
  return {
    ...DEFAULT_GATEWAY_LIMITS,
    unauthenticatedMaxConnections: unauthenticatedCap(maxConnections),
    ...limits,
  };
}

export interface GatewayContext {
  chooser: UpstreamChooser;
  egress: EgressGuard;
  metrics: GatewayMetrics;
  tracer: Tracer;
  log: Logger;
  limits: GatewayLimits;
  clock: Clock;
  /** The response rules (gateway/rules), from the providers config or the defaults. */
  rules: readonly Rule[];
  /** Registers an open connection's lease for renewal; `cut` ends the connection if renewal is refused. */
  hold(a: Acquired, cut: () => void): void;
  /** The connection ended: stop renewing, release the lease. */
  letGo(a: Acquired): void;
  /** Kept-alive connections to upstreams for plain-HTTP requests (gateway/forward). */
  upstreamPool: ConnectionPool;
}
