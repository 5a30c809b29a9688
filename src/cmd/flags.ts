/**
 * cmd/flags — command-line parsing and validation, pure: argv in, a typed configuration or
 * one precise error out. Nothing starts until every flag has been checked.
 */

import { isHostGlob } from '../config/gateway-rules.ts';
import { parseSurgeLimit, type SurgeLimit } from '../controller/surge.ts';
import { DEFAULT_GATEWAY_LIMITS } from '../gateway/context.ts';
import { parseBindAddress } from '../metrics/bind.ts';
import {
  DEFAULT_DISCOVERY_MAX_CONNECTIONS,
  DEFAULT_HEALTH_PROBE_MAX_CONNECTIONS,
  DEFAULT_METRICS_MAX_CONNECTIONS,
  type ListenerLimits,
} from '../metrics/listener.ts';
import { installationIdProblem } from '../provider/installation.ts';
import { DEFAULT_LOCAL_PROXIES_MAX_CONNECTIONS } from '../provider/local/forward-proxy.ts';
import { FlagError, parse, type Values } from './argv.ts';

export interface CommonFlags {
  discoveryBindAddress: string;
  metricsBindAddress: string;
  healthProbeBindAddress: string;
  providerCheckIntervalMs: number;
  providerCheckTimeoutMs: number;
  gcIntervalMs: number;
  gcMinAgeMs: number;
  traceHealthProbes: boolean;
  gcpWireFullPayloads: boolean;
  egressIpUrl?: string;
  logLevel: string;
  logFormat: 'auto' | 'json' | 'pretty';
  shutdownGraceMs: number;
  /** --installation-id; default: the kube-system UID (cluster) or the one kept in the state file. */
  installationId?: string;
  /** `--discovery-tls-cert` / `--discovery-tls-key`: serve the discovery API over HTTPS. */
  discoveryTls?: { certFile: string; keyFile: string };
  /** `--discovery-allowed-hosts`: Host names served without a token besides loopback and the bind address. */
  discoveryAllowedHosts: string[];
  /** Timeouts and connection caps of the discovery API and metrics listeners. */
  discoveryLimits: ListenerLimits;
  metricsLimits: ListenerLimits;
  /** Connection cap of the health-probe port (no flag). */
  healthProbeMaxConnections: number;
  /** Connections open at once across every local proxy of the process (no flag). */
  localProxiesMaxConnections: number;
  /**
   * The connection-cap flags given on the command line (`--gateway-max-connections`, ...):
   * lowering one of these to fit the file-descriptor limit is warned about by name.
   */
  explicitCaps: string[];
  /** Lease authority (docs/deployment.md): how often lease state is checkpointed, and its caps. */
  leases: LeaseFlags;
  /** `--max-concurrent-replacements`: per provider, a count or a percentage of its Proxies. */
  maxConcurrentReplacements: SurgeLimit;
  /** The gateway (docs/gateway.md): where it listens ('0' = off) and which answers mean "blocked". */
  gateway: GatewayFlags;
}

export interface GatewayFlags {
  /** `--gateway-bind-address` (standalone 127.0.0.1:8888, operator 0 = off). */
  bindAddress: string;
  /**
   * `--gateway-blocked-statuses`, deprecated: the statuses of the default response rules when
   * the providers config has no `gateway.rules`; undefined unless given.
   */
  blockedStatuses?: number[];
  /** `--gateway-inspect`: terminate CONNECTs' TLS and apply response rules to HTTPS. */
  inspect: boolean;
  /** `--gateway-inspect-exclude`: host globs tunnelled untouched. */
  inspectExclude: string[];
  /** `--gateway-origin-ca`: a PEM bundle trusted for origins besides the system store. */
  originCaFile?: string;
  /** `--gateway-max-connections` (default 20000, lowered to fit the file-descriptor limit). */
  maxConnections: number;
}

export interface LeaseFlags {
  /** `--lease-checkpoint-interval` (default 5s). */
  checkpointIntervalMs: number;
  /** `--max-active-leases` (default 100000). */
  maxActiveLeases: number;
  /**
   * `--drain-timeout` (default 10m): a replaced instance is deleted at most this long after the
   * switch, and no lease on a draining proxy is renewed past it. 0 = no drain.
   */
  drainTimeoutMs: number;
  /** `--ended-lease-memory` (default 64Mi): budget of the ended leases API clients may still report. */
  endedLeaseBytes: number;
  /**
   * `--discard-lease-state`: start from no leases or cooldowns when the lease checkpoint is
   * damaged, instead of refusing to start (standalone) or to decide leases (leader).
   */
  discardLeaseState: boolean;
}

export interface StandaloneFlags extends CommonFlags {
  /** Providers config file, or a directory holding `providers.yaml`. */
  config: string;
  /** Proxy/Secret manifests (file or directory); default `<config dir>/proxies`. */
  manifests?: string;
  state?: string;
  /** Let a rescan delete all Proxies, or more than half of them, at once. */
  allowEmptyManifests: boolean;
}

export interface OperatorFlags extends CommonFlags {
  providersConfig: string;
  leaderElect: boolean;
  leaderElectionNamespace?: string;
  proxyNamespace?: string;
  metricsSecure: boolean;
  /** `--metrics-cert-dir`: tls.crt and tls.key for `--metrics-secure` (default: self-signed at start). */
  metricsCertDir?: string;
  kubeconfig?: string;
}

export interface StatusFlags {
  server: string;
  token?: string;
  /** `--target`: leasability and cooldowns for this site. */
  target?: string;
  output: 'table' | 'json';
}

export type ParsedCommand =
  | { command: 'standalone'; flags: StandaloneFlags }
  | { command: 'operator'; flags: OperatorFlags }
  | { command: 'status'; flags: StatusFlags }
  | { command: 'check-config'; providersConfig: string }
  | { command: 'help'; topic?: string }
  | { command: 'version' };

const UNITS: Record<string, number> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000 };

/** Go-style durations as used by the flags: `90s`, `10m`, `1h30m`, `500ms`, `0`. */
export function parseDuration(flag: string, text: string): number {
  if (text === '0') return 0;
  const re = /(\d+(?:\.\d+)?)(ms|s|m|h)/g;
  let total = 0;
  let consumed = 0;
  for (const m of text.matchAll(re)) {
    if (m.index !== consumed) break;
    total += Number(m[1]) * (UNITS[m[2] as string] ?? 0);
    consumed += m[0].length;
  }
  if (consumed !== text.length || consumed === 0) {
    throw new FlagError(`--${flag}: "${text}" is not a duration (use e.g. 500ms, 30s, 10m, 1h)`);
  }
  return total;
}

/** `host:port`, `:port` (all interfaces) or `0` (disabled), checked by the servers' own parser. */
function checkBindAddress(flag: string, text: string): string {
  try {
    parseBindAddress(text, `--${flag}`);
  } catch (err) {
    throw new FlagError((err as Error).message);
  }
  return text;
}

const COMMON_OPTIONS = {
  'discovery-bind-address': { type: 'string' },
  'metrics-bind-address': { type: 'string' },
  'health-probe-bind-address': { type: 'string' },
  'provider-check-interval': { type: 'string' },
  'provider-check-timeout': { type: 'string' },
  'gc-interval': { type: 'string' },
  'gc-min-age': { type: 'string' },
  'drain-timeout': { type: 'string' },
  'max-concurrent-replacements': { type: 'string' },
  'trace-health-probes': { type: 'boolean' },
  'gcp-wire-full-payloads': { type: 'boolean' },
  'egress-ip-url': { type: 'string' },
  'log-level': { type: 'string' },
  'log-format': { type: 'string' },
  'shutdown-grace-period': { type: 'string' },
  'installation-id': { type: 'string' },
  'discovery-tls-cert': { type: 'string' },
  'discovery-tls-key': { type: 'string' },
  'discovery-allowed-hosts': { type: 'string' },
  'http-header-timeout': { type: 'string' },
  'http-request-timeout': { type: 'string' },
  'http-idle-timeout': { type: 'string' },
  'discovery-max-connections': { type: 'string' },
  'metrics-max-connections': { type: 'string' },
  'lease-checkpoint-interval': { type: 'string' },
  'max-active-leases': { type: 'string' },
  'ended-lease-memory': { type: 'string' },
  'discard-lease-state': { type: 'boolean' },
  'gateway-bind-address': { type: 'string' },
  'gateway-blocked-statuses': { type: 'string' },
  'gateway-inspect': { type: 'boolean' },
  'gateway-inspect-exclude': { type: 'string' },
  'gateway-origin-ca': { type: 'string' },
  'gateway-max-connections': { type: 'string' },
  help: { type: 'boolean', short: 'h' },
} as const;

/** A positive whole number of connections. */
function parseCount(flag: string, text: string): number {
  if (!/^\d{1,7}$/.test(text) || Number(text) < 1) {
    throw new FlagError(`--${flag}: "${text}" must be a whole number from 1 to 9999999`);
  }
  return Number(text);
}

/** A size in MiB or GiB (`64Mi`, `1Gi`), from 1 MiB to 64 GiB; in bytes. */
function parseMemory(flag: string, text: string): number {
  const m = /^(\d{1,5})(Mi|Gi)$/.exec(text);
  const bytes = m ? Number(m[1]) * 2 ** (m[2] === 'Gi' ? 30 : 20) : 0;
  if (bytes < 2 ** 20 || bytes > 64 * 2 ** 30) {
    throw new FlagError(`--${flag}: "${text}" must be a size from 1Mi to 64Gi (e.g. 64Mi, 1Gi)`);
  }
  return bytes;
}

/**
 * The lease authority's flags: checkpoint interval, active-lease cap, drain deadline, the
 * ended-lease budget and what a damaged checkpoint does.
 */
function leaseFlags(values: Values): LeaseFlags {
  const str = (k: string) => values[k] as string | undefined;
  const interval = parseDuration('lease-checkpoint-interval', str('lease-checkpoint-interval') ?? '5s');
  if (interval < 100 || interval > 300_000) {
    throw new FlagError(
      '--lease-checkpoint-interval: must be from 100ms to 5m (a crash loses at most this much)',
    );
  }
  const drain = parseDuration('drain-timeout', str('drain-timeout') ?? '10m');
  return {
    checkpointIntervalMs: interval,
    maxActiveLeases: parseCount('max-active-leases', str('max-active-leases') ?? '100000'),
    drainTimeoutMs: drain,
    endedLeaseBytes: parseMemory('ended-lease-memory', str('ended-lease-memory') ?? '64Mi'),
    discardLeaseState: values['discard-lease-state'] === true,
  };
}

/** A positive duration: a listener timeout of 0 would mean "never". */
function positiveDuration(flag: string, text: string): number {
  const ms = parseDuration(flag, text);
  if (ms < 1)
    throw new FlagError(`--${flag}: must be more than 0 (a listener without this timeout waits forever)`);
  return ms;
}

/** The listener flags shared by the discovery API and metrics (docs/operations.md, "Listeners"). */
function listenerFlags(
  values: Values,
): Pick<CommonFlags, 'discoveryTls' | 'discoveryAllowedHosts' | 'discoveryLimits' | 'metricsLimits'> {
  const str = (k: string) => values[k] as string | undefined;
  const timeouts = {
    headersTimeoutMs: positiveDuration('http-header-timeout', str('http-header-timeout') ?? '10s'),
    requestTimeoutMs: positiveDuration('http-request-timeout', str('http-request-timeout') ?? '30s'),
    idleTimeoutMs: positiveDuration('http-idle-timeout', str('http-idle-timeout') ?? '30s'),
  };
  if (timeouts.headersTimeoutMs > timeouts.requestTimeoutMs) {
    throw new FlagError('--http-header-timeout: must not exceed --http-request-timeout');
  }
  const cert = str('discovery-tls-cert') || undefined;
  const key = str('discovery-tls-key') || undefined;
  if ((cert === undefined) !== (key === undefined)) {
    throw new FlagError(
      `--${cert ? 'discovery-tls-key' : 'discovery-tls-cert'}: required together with --${cert ? 'discovery-tls-cert' : 'discovery-tls-key'}`,
    );
  }
  const hosts = (str('discovery-allowed-hosts') ?? '')
    .split(',')
    .map((h) => h.trim())
    .filter((h) => h !== '');
  for (const h of hosts) {
    if (!/^\.?[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$/.test(h) || h.length > 253) {
      throw new FlagError(`--discovery-allowed-hosts: "${h}" is not a host name (or .suffix)`);
    }
  }
  return {
    ...(cert && key ? { discoveryTls: { certFile: cert, keyFile: key } } : {}),
    discoveryAllowedHosts: hosts,
    discoveryLimits: {
      ...timeouts,
      maxConnections: parseCount(
        'discovery-max-connections',
        str('discovery-max-connections') ?? String(DEFAULT_DISCOVERY_MAX_CONNECTIONS),
      ),
    },
    metricsLimits: {
      ...timeouts,
      maxConnections: parseCount(
        'metrics-max-connections',
        str('metrics-max-connections') ?? String(DEFAULT_METRICS_MAX_CONNECTIONS),
      ),
    },
  };
}

function common(
  values: Values,
  defaults: { discovery: string; healthProbe: string; gateway: string },
): CommonFlags {
  const str = (k: string) => values[k] as string | undefined;
  const interval = parseDuration('provider-check-interval', str('provider-check-interval') ?? '1m');
  if (interval !== 0 && interval < 10_000) {
    throw new FlagError('--provider-check-interval: must be 0 (off) or at least 10s');
  }
  const timeoutText = str('provider-check-timeout') ?? '0';
  let timeout = parseDuration('provider-check-timeout', timeoutText);
  if (timeout === 0) timeout = Math.min(15_000, interval || 15_000);
  else if (interval !== 0 && timeout > interval) {
    throw new FlagError('--provider-check-timeout: must not exceed --provider-check-interval');
  }
  const logFormat = str('log-format') ?? 'auto';
  if (logFormat !== 'auto' && logFormat !== 'json' && logFormat !== 'pretty') {
    throw new FlagError(`--log-format: "${logFormat}" must be auto, json or pretty`);
  }
  const logLevel = str('log-level') ?? process.env.LOG_LEVEL ?? 'info';
  if (!['trace', 'debug', 'info', 'warn', 'error', 'fatal', 'silent'].includes(logLevel)) {
    throw new FlagError(
      `--log-level: "${logLevel}" must be one of trace, debug, info, warn, error, fatal, silent`,
    );
  }
  const egressIpUrl = str('egress-ip-url');
  if (egressIpUrl !== undefined && !/^https?:\/\/\S+$/.test(egressIpUrl)) {
    throw new FlagError(`--egress-ip-url: "${egressIpUrl}" must be an http(s) URL`);
  }
  const gcInterval = parseDuration('gc-interval', str('gc-interval') ?? '10m');
  const installationId = str('installation-id');
  if (installationId !== undefined) {
    const problem = installationIdProblem(installationId, '--installation-id');
    if (problem) throw new FlagError(problem);
  }
  return {
    discoveryBindAddress: checkBindAddress(
      'discovery-bind-address',
      str('discovery-bind-address') ?? defaults.discovery,
    ),
    metricsBindAddress: checkBindAddress('metrics-bind-address', str('metrics-bind-address') ?? '0'),
    healthProbeBindAddress: checkBindAddress(
      'health-probe-bind-address',
      str('health-probe-bind-address') ?? defaults.healthProbe,
    ),
    providerCheckIntervalMs: interval,
    providerCheckTimeoutMs: timeout,
    gcIntervalMs: gcInterval,
    gcMinAgeMs: parseDuration('gc-min-age', str('gc-min-age') ?? '10m'),
    traceHealthProbes: values['trace-health-probes'] === true,
    gcpWireFullPayloads: values['gcp-wire-full-payloads'] === true,
    egressIpUrl,
    logLevel,
    logFormat,
    shutdownGraceMs: parseDuration('shutdown-grace-period', str('shutdown-grace-period') ?? '30s'),
    ...(installationId !== undefined ? { installationId } : {}),
    ...listenerFlags(values),
    healthProbeMaxConnections: DEFAULT_HEALTH_PROBE_MAX_CONNECTIONS,
    localProxiesMaxConnections: DEFAULT_LOCAL_PROXIES_MAX_CONNECTIONS,
    explicitCaps: CAP_FLAGS.filter((f) => str(f) !== undefined),
    leases: leaseFlags(values),
    maxConcurrentReplacements: surgeFlag(str('max-concurrent-replacements') ?? '10%'),
    gateway: gatewayFlags(values, defaults.gateway),
  };
}

/** `403,429`: HTTP statuses (100-599), at least one; `none` turns automatic blocked reports off. */
function parseStatuses(flag: string, text: string): number[] {
  if (text.trim() === 'none') return [];
  const out = text.split(',').map((t) => t.trim());
  for (const t of out) {
    if (!/^[1-5]\d\d$/.test(t)) {
      throw new FlagError(
        `--${flag}: "${t}" is not an HTTP status (100-599); list them like 403,429 or say none`,
      );
    }
  }
  return [...new Set(out.map(Number))];
}

/** The flags that set a connection cap. */
const CAP_FLAGS = ['gateway-max-connections', 'discovery-max-connections', 'metrics-max-connections'];

function gatewayFlags(values: Values, defaultBind: string): GatewayFlags {
  const str = (k: string) => values[k] as string | undefined;
  const blocked = str('gateway-blocked-statuses');
  const exclude = (str('gateway-inspect-exclude') ?? '')
    .split(',')
    .map((g) => g.trim())
    .filter((g) => g !== '');
  for (const g of exclude) {
    if (!isHostGlob(g)) {
      throw new FlagError(
        `--gateway-inspect-exclude: "${g}" is not a host glob (letters, digits, ".", "-", ":" and "*", e.g. *.bank.example)`,
      );
    }
  }
  const inspect = values['gateway-inspect'] === true;
  if (!inspect && (exclude.length > 0 || str('gateway-origin-ca') !== undefined)) {
    throw new FlagError('--gateway-inspect-exclude and --gateway-origin-ca need --gateway-inspect');
  }
  const originCaFile = str('gateway-origin-ca');
  return {
    bindAddress: checkBindAddress('gateway-bind-address', str('gateway-bind-address') ?? defaultBind),
    ...(blocked === undefined ? {} : { blockedStatuses: parseStatuses('gateway-blocked-statuses', blocked) }),
    inspect,
    inspectExclude: exclude,
    ...(originCaFile === undefined ? {} : { originCaFile }),
    maxConnections: parseCount(
      'gateway-max-connections',
      str('gateway-max-connections') ?? String(DEFAULT_GATEWAY_LIMITS.maxConnections),
    ),
  };
}

function surgeFlag(text: string): SurgeLimit {
  try {
    return parseSurgeLimit(text);
  } catch (err) {
    throw new FlagError(`--max-concurrent-replacements: ${(err as Error).message}`);
  }
}

export function parseCommandLine(argv: string[]): ParsedCommand {
  const [first, ...rest] = argv;
  if (first === undefined || first === '--help' || first === '-h' || first === 'help') {
    return { command: 'help', topic: rest[0] || undefined };
  }
  if (first === '--version' || first === 'version') return { command: 'version' };
  switch (first) {
    case 'standalone': {
      const { values } = parse(rest, {
        ...COMMON_OPTIONS,
        config: { type: 'string', short: 'c' },
        manifests: { type: 'string', short: 'm' },
        state: { type: 'string' },
        'allow-empty-manifests': { type: 'boolean' },
      });
      if (values.help) return { command: 'help', topic: 'standalone' };
      const config = values.config as string | undefined;
      if (!config) throw new FlagError('--config is required: a providers config file or a directory');
      const flags: StandaloneFlags = {
        ...common(values, {
          discovery: '127.0.0.1:8090',
          healthProbe: '127.0.0.1:8081',
          gateway: '127.0.0.1:8888',
        }),
        config,
        manifests: (values.manifests as string | undefined) || undefined,
        state: (values.state as string | undefined) || undefined,
        allowEmptyManifests: values['allow-empty-manifests'] === true,
      };
      return { command: 'standalone', flags };
    }
    case 'operator': {
      const { values } = parse(rest, {
        ...COMMON_OPTIONS,
        'providers-config': { type: 'string' },
        'leader-elect': { type: 'boolean' },
        'leader-election-namespace': { type: 'string' },
        'proxy-namespace': { type: 'string' },
        'metrics-secure': { type: 'boolean' },
        'metrics-cert-dir': { type: 'string' },
        kubeconfig: { type: 'string' },
      });
      if (values.help) return { command: 'help', topic: 'operator' };
      const providersConfig = values['providers-config'] as string | undefined;
      if (!providersConfig) throw new FlagError('--providers-config is required');
      const str = (k: string) => values[k] as string | undefined;
      const flags: OperatorFlags = {
        ...common(values, { discovery: ':8090', healthProbe: ':8081', gateway: '0' }),
        providersConfig,
        leaderElect: values['leader-elect'] === true,
        metricsSecure: values['metrics-secure'] === true,
        metricsCertDir: str('metrics-cert-dir') || undefined,
        // An empty value means the default, as if the flag were not given.
        leaderElectionNamespace: str('leader-election-namespace') || undefined,
        proxyNamespace: str('proxy-namespace') || undefined,
        kubeconfig: str('kubeconfig') || undefined,
      };
      return { command: 'operator', flags };
    }
    case 'status': {
      const { values } = parse(rest, {
        server: { type: 'string', short: 's' },
        // The same URL under the name the operator's own flags and logs give it.
        'discovery-url': { type: 'string' },
        token: { type: 'string' },
        output: { type: 'string', short: 'o' },
        target: { type: 'string', short: 't' },
        help: { type: 'boolean', short: 'h' },
      });
      if (values.help) return { command: 'help', topic: 'status' };
      const output = (values.output as string | undefined) ?? 'table';
      if (output !== 'table' && output !== 'json') {
        throw new FlagError(`--output: "${output}" must be table or json`);
      }
      const given = values.server as string | undefined;
      const alias = values['discovery-url'] as string | undefined;
      if (given !== undefined && alias !== undefined) {
        throw new FlagError('--discovery-url: is another name for --server; give one of them');
      }
      const flag = alias === undefined ? '--server' : '--discovery-url';
      const server = given ?? alias ?? 'http://127.0.0.1:8090';
      if (!/^https?:\/\/\S+$/.test(server))
        throw new FlagError(`${flag}: "${server}" must be an http(s) URL`);
      const token = (values.token as string | undefined) ?? process.env.DISCOVERY_TOKEN;
      // A token read from a Secret file usually ends in a newline.
      const target = (values.target as string | undefined)?.trim() || undefined;
      return {
        command: 'status',
        flags: { server, output, token: token?.trim() || undefined, ...(target ? { target } : {}) },
      };
    }
    case 'check-config': {
      const { values } = parse(rest, {
        'providers-config': { type: 'string' },
        help: { type: 'boolean', short: 'h' },
      });
      if (values.help) return { command: 'help', topic: 'check-config' };
      const providersConfig = values['providers-config'] as string | undefined;
      if (!providersConfig) throw new FlagError('--providers-config is required');
      return { command: 'check-config', providersConfig };
    }
    default:
      throw new FlagError(
        `unknown command "${first}": use standalone, operator, status or check-config (see --help)`,
      );
  }
}

export { FlagError } from './argv.ts';
export { helpText } from './help.ts';
