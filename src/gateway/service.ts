/**
 * gateway/service — the gateway as the composition root runs it: checks at start-up that a
 * gateway without a token listens on loopback only (and says loudly that it has no token), builds
 * the egress guard from the providers config's `gateway.egressPolicy`, and serves until stopped.
 */
import type { Tracer } from '@opentelemetry/api';
import type { Logger } from 'pino';
import type { Registry } from 'prom-client';
import { type EgressPolicyConfig, resolveEgressPolicy } from '../config/egress.ts';
import type { LeaseStore } from '../lease/store.ts';
import type { ReportResult } from '../lease/types.ts';
import { parseBindAddress } from '../metrics/bind.ts';
import { EgressGuard } from '../provider/local/egress.ts';
import type { Clock } from '../runtime/clock.ts';
import { Gateway } from './server.ts';
import { LeaseStoreChooser, type UpstreamChooser } from './upstreams.ts';

export interface GatewaySetup {
  bindAddress: string;
  blockedStatuses: number[];
  /** Connections open at once (fitted under the open-files limit by cmd/caps); default 20000. */
  maxConnections?: number;
  token: string | undefined;
  egressPolicy: EgressPolicyConfig | undefined;
  /** The operator's own ports on this host, which gateway clients may not reach; `names` says which listener. */
  operatorPorts: { ports: number[]; probePort?: number; names?: Readonly<Record<number, string>> };
}

const LOOPBACK_HOSTS = new Set(['127.0.0.1', '::1', 'localhost']);

/**
 * Why this setup may not start, or undefined. A tokenless gateway on a non-loopback address
 * would be an open proxy into the fleet.
 */
export function gatewaySetupProblem(setup: GatewaySetup): string | undefined {
  let bind: ReturnType<typeof parseBindAddress>;
  try {
    bind = parseBindAddress(setup.bindAddress, '--gateway-bind-address');
  } catch (err) {
    return (err as Error).message;
  }
  if (bind === null || setup.token !== undefined) return undefined;
  if (bind.host === undefined || !LOOPBACK_HOSTS.has(bind.host)) {
    return `--gateway-bind-address ${setup.bindAddress}: without GATEWAY_TOKEN or DISCOVERY_TOKEN the gateway listens on loopback only (127.0.0.1:<port>); set a token to serve other hosts`;
  }
  return undefined;
}

export interface GatewayRunDeps {
  leases: LeaseStore;
  clock: Clock;
  log: Logger;
  registry: Registry;
  tracer: Tracer;
  sessions: GatewaySessions;
  /** Who chooses upstreams; default: the lease store in this process (standalone). */
  chooser?: UpstreamChooser;
  /** Runs beside the listener while it serves (cluster mode: the link to the leader's hub). */
  alongside?: (signal: AbortSignal) => Promise<void>;
}

/**
 * The gateway's egress guard: the providers config's `gateway.egressPolicy`, which its refusals
 * name as the field to change, and the operator's own ports.
 */
export function gatewayEgressGuard(setup: Pick<GatewaySetup, 'egressPolicy' | 'operatorPorts'>): EgressGuard {
  const { ports, probePort, names } = setup.operatorPorts;
  const own = new Set(ports);
  return new EgressGuard(
    resolveEgressPolicy(setup.egressPolicy),
    {
      isOwnPort: (p) => own.has(p),
      describe: (p) => names?.[p],
      ...(probePort === undefined ? {} : { probePort }),
    },
    undefined,
    { field: 'gateway.egressPolicy', ...(setup.egressPolicy ? { config: setup.egressPolicy } : {}) },
  );
}

/** Serves the gateway until `signal` aborts; returns without listening when it is off ('0'). */
export async function runGateway(
  setup: GatewaySetup,
  deps: GatewayRunDeps,
  signal: AbortSignal,
): Promise<void> {
  const bind = parseBindAddress(setup.bindAddress, '--gateway-bind-address');
  if (bind === null || signal.aborted) return;
  const egress = gatewayEgressGuard(setup);
  const chooser = deps.chooser ?? new LeaseStoreChooser(deps.leases, deps.clock);
  const gateway = new Gateway({
    bind,
    token: setup.token,
    chooser,
    egress,
    clock: deps.clock,
    log: deps.log,
    registry: deps.registry,
    tracer: deps.tracer,
    blockedStatuses: setup.blockedStatuses,
    ...(setup.maxConnections === undefined ? {} : { limits: { maxConnections: setup.maxConnections } }),
  });
  const address = await gateway.listen();
  deps.sessions.serve(chooser);
  if (setup.token === undefined) {
    deps.log.warn(
      { address },
      'GATEWAY: no GATEWAY_TOKEN or DISCOVERY_TOKEN set — the gateway serves loopback clients WITHOUT a password',
    );
  }
  deps.log.info({ address }, 'gateway listening');
  await Promise.all([
    deps.alongside?.(signal),
    new Promise<void>((resolve) => signal.addEventListener('abort', () => resolve(), { once: true })),
  ]);
  deps.sessions.serve(undefined);
  await gateway.close();
}

export type SessionReportOutcome =
  | { ok: true; upstream: string; target: string }
  | { ok: false; status: 404 | 409; message: string };

/**
 * The gateway's sticky sessions as the discovery API sees them (`POST /v1/sessions/{id}/report`,
 * docs/lease-api.md): reports reach the sessions of the gateway running in this process, if any.
 */
export class GatewaySessions {
  private chooser: UpstreamChooser | undefined;
  private readonly elsewhere: SessionAsker | undefined;

  /** `elsewhere` (cluster mode): asks the other replicas' gateways about a session this one does not know. */
  constructor(elsewhere?: SessionAsker) {
    this.elsewhere = elsewhere;
  }

  serve(chooser: UpstreamChooser | undefined): void {
    this.chooser = chooser;
  }

  async report(id: string, result: ReportResult, target: string | undefined): Promise<SessionReportOutcome> {
    if (!this.chooser)
      return { ok: false, status: 409, message: 'the gateway is not running in this process' };
    const r = this.chooser.reportSession(id, result, target);
    if (r.ok) return r;
    const there = await this.elsewhere?.(id, result, target);
    return there ? { ok: true, ...there } : { ok: false, status: 404, message: r.message };
  }
}

/** Applies a session report on whichever replica knows the session (gateway/hub), or undefined. */
export type SessionAsker = (
  id: string,
  result: ReportResult,
  target: string | undefined,
) => Promise<{ upstream: string; target: string } | undefined>;
