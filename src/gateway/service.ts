/**
 * gateway/service — the gateway as the composition root runs it: checks at start-up that a
 * gateway without a token listens on loopback only (and says loudly that it has no token), builds
 * the egress guard from the providers config's `gateway.egressPolicy` and the response rules from
 * its `gateway.rules`, opens the inspection CA when asked to, and serves until stopped.
 */

import { X509Certificate } from 'node:crypto';
import { readFile } from 'node:fs/promises';
import type { Tracer } from '@opentelemetry/api';
import type { Logger } from 'pino';
import type { Registry } from 'prom-client';
import { type EgressPolicyConfig, resolveEgressPolicy } from '../config/egress.ts';
import type { GatewayRuleConfig } from '../config/schema.ts';
import type { LeaseStore } from '../lease/store.ts';
import type { ReportResult } from '../lease/types.ts';
import { parseBindAddress } from '../metrics/bind.ts';
import { EgressGuard } from '../provider/local/egress.ts';
import type { Clock } from '../runtime/clock.ts';
import { type CaStore, GatewayCa } from './ca.ts';
import type { InspectSetup } from './inspect.ts';
import { DEFAULT_RULES, rulesForBlockedStatuses } from './rules.ts';
import { Gateway } from './server.ts';
import { LeaseStoreChooser, type UpstreamChooser } from './upstreams.ts';

export interface GatewaySetup {
  bindAddress: string;
  /** Deprecated `--gateway-blocked-statuses`: the default rules' statuses when `rules` is absent. */
  blockedStatuses?: number[];
  /** The providers config's `gateway.rules`; default DEFAULT_RULES. */
  rules?: GatewayRuleConfig[];
  /** HTTPS inspection (`--gateway-inspect`), with the CA's store; off when absent. */
  inspect?: { exclude: string[]; originCaFile?: string; caStore: CaStore };
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
  const rules = gatewayRules(setup, deps.log);
  const inspect = setup.inspect ? await inspectSetup(setup.inspect, deps) : undefined;
  const gateway = new Gateway({
    bind,
    token: setup.token,
    chooser,
    egress,
    clock: deps.clock,
    log: deps.log,
    registry: deps.registry,
    tracer: deps.tracer,
    rules,
    ...(inspect ? { inspect } : {}),
    ...(setup.maxConnections === undefined ? {} : { limits: { maxConnections: setup.maxConnections } }),
  });
  const address = await gateway.listen();
  deps.sessions.serve(chooser);
  deps.sessions.caCertificate = inspect?.ca.certPem;
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
  deps.sessions.caCertificate = undefined;
  await gateway.close();
}

/**
 * The response rules: the providers config's, else the defaults, whose statuses the deprecated
 * `--gateway-blocked-statuses` still sets (with a warning, once, at start).
 */
export function gatewayRules(
  setup: Pick<GatewaySetup, 'rules' | 'blockedStatuses'>,
  log: Logger,
): readonly GatewayRuleConfig[] {
  if (setup.blockedStatuses !== undefined) {
    log.warn(
      setup.rules
        ? '--gateway-blocked-statuses is deprecated and ignored: the providers config has gateway.rules'
        : '--gateway-blocked-statuses is deprecated: write gateway.rules in the providers config (docs/gateway.md, "Rules")',
    );
  }
  if (setup.rules) return setup.rules;
  return setup.blockedStatuses ? rulesForBlockedStatuses(setup.blockedStatuses) : DEFAULT_RULES;
}

/** `--gateway-origin-ca`: a PEM bundle of at least one certificate; any problem names the flag. */
async function readOriginCa(file: string): Promise<string> {
  let text: string;
  try {
    text = await readFile(file, 'utf8');
  } catch (err) {
    throw new Error(`--gateway-origin-ca ${file}: ${(err as Error).message}`, { cause: err });
  }
  try {
    new X509Certificate(text);
  } catch (err) {
    throw new Error(`--gateway-origin-ca ${file}: not a PEM certificate bundle (${(err as Error).message})`, {
      cause: err,
    });
  }
  return text;
}

/** Opens (or makes) the inspection CA and reads the extra origin trust; names where, never the key. */
async function inspectSetup(
  setup: NonNullable<GatewaySetup['inspect']>,
  deps: Pick<GatewayRunDeps, 'clock' | 'log'>,
): Promise<InspectSetup> {
  const ca = await GatewayCa.open(setup.caStore, () => deps.clock.now());
  const originCa = setup.originCaFile === undefined ? undefined : await readOriginCa(setup.originCaFile);
  deps.log.info(
    {
      ca: setup.caStore.where,
      fingerprint: new X509Certificate(ca.certPem).fingerprint256,
      exclude: setup.exclude,
    },
    'gateway inspects HTTPS: clients must trust the CA at GET /v1/gateway/ca.pem',
  );
  return { ca, exclude: setup.exclude, ...(originCa === undefined ? {} : { originCa }) };
}

export type SessionReportOutcome =
  | { ok: true; upstream: string; target: string }
  | { ok: false; status: 404 | 409; message: string };

/**
 * The gateway as the discovery API sees it: its sticky sessions (`POST /v1/sessions/{id}/report`,
 * docs/lease-api.md), whose reports reach the sessions of the gateway running in this process,
 * if any, and the public certificate of its inspection CA.
 */
export class GatewaySessions {
  /** The inspection CA's public certificate while the gateway inspects HTTPS (`GET /v1/gateway/ca.pem`). */
  caCertificate: string | undefined;
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
