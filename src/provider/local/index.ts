/**
 * provider/local — the `local` provider: each instance is an authenticated forward proxy served
 * by the operator process itself on a port from a configured range. For development, demos, the
 * test suite and the standalone quick start. Instances live and die with the process: after a
 * restart `get` answers NotFound and the reconciler re-creates them (on the same port when it can).
 */
import net from 'node:net';
import { hostname } from 'node:os';
import type { Logger } from 'pino';
import type { Counter, Registry } from 'prom-client';
import { type Location, locationOf } from '../../api/location.ts';
import type { TargetCheck } from '../../api/providerhealth.ts';
import { resolveEgressPolicy } from '../../config/egress.ts';
import { egressAddressProblems, expandEgressAddresses } from '../../config/egress-addresses.ts';
import type { LocalProviderConfig } from '../../config/schema.ts';
import { errorMessage } from '../../log/errors.ts';
import { silentLogger } from '../../log/index.ts';
import { counter } from '../../metrics/register.ts';
import type { CallContext, Checker, CreateRequest, Instance, Provider } from '../contract.ts';
import { notFound, permanent, quotaExceeded, transient } from '../errors.ts';
import { EgressAddressPool, type EgressReservation } from './address-pool.ts';
import { EgressGuard } from './egress.ts';
import { ForwardProxy, type ProxyLimits, type SharedConnectionCap } from './forward-proxy.ts';
import { portCandidates, tryBind } from './ports.ts';

export { preferredPort } from './ports.ts';

export const LOCAL_PROVIDER_TYPE = 'local';
export const LOCAL_ID_PREFIX = 'local/';
export const DEFAULT_LOCAL_BIND_ADDRESS = '127.0.0.1';
export const DEFAULT_LOCAL_PORT_RANGE = { from: 20000, to: 20999 } as const;

const NAME_PATTERN = /^[A-Za-z0-9][A-Za-z0-9_.-]*$/;

export interface LocalProviderOptions {
  /** Provider name from the providers config. */
  name: string;
  config?: LocalProviderConfig;
  log?: Logger;
  /** How long a tunnel or forwarded request waits for the origin's TCP accept. Default 10 s. */
  connectTimeoutMs?: number;
  /** Where the denial and dropped-connection counters go. */
  registry?: Registry;
  /**
   * The operator's own listening ports (discovery, metrics, health probes): closed to lease
   * holders on this host whatever the policy allows, except the discovery API's probe route.
   * The proxies' own port range is always included.
   */
  operator?: { ports: readonly number[]; probePort?: number; names?: Readonly<Record<number, string>> };
  /** Timeouts and connection cap of every listener; defaults in DEFAULT_PROXY_LIMITS. */
  limits?: Partial<ProxyLimits>;
  /** A cap on the connections of all listeners together (shared with other local providers). */
  sharedCap?: SharedConnectionCap;
  /**
   * Per-lease credentials: whether `username`/`password` belong to a live lease granted on the
   * instance `providerID` (the lease store answers; wired in cmd). The instance's own
   * credentials are accepted too — the health engine probes with them.
   */
  leaseCredentials?: (providerID: string, username: string, password: string) => boolean;
  /** Opens origin connections (tests); default net.connect. */
  dial?: (host: string, port: number, localAddress?: string) => net.Socket;
  /**
   * The source addresses Proxies of this provider hold in `status.egressIP` (wired in cmd from
   * the object store): with `egressAddresses`, another Proxy's address is not handed out.
   */
  egressReservations?: () => EgressReservation[];
  /** The machine's host name, its instances' zone (default: os.hostname()). */
  hostname?: string;
}

/**
 * Where local instances run: the machine, named by its host name's first label (the zone); no
 * region. A host name that is not a label value gives no location.
 */
export function localLocation(host: string): Location | undefined {
  return locationOf(undefined, host.split('.')[0]);
}

interface Entry {
  name: string;
  proxy: ForwardProxy;
  port: number;
  /** Source address of its upstream connections (`egressAddresses`), if any. */
  egressIP?: string;
  uid: string;
  namespace: string;
  /** Local instances live in this process, so they only ever carry its own installation. */
  installation?: string;
  createdAt: Date;
}

export type LocalProvider = Provider & Checker & { close(): Promise<void> };

/** Builds the provider; throws only for a config that can never work, naming the field. */
export function createLocalProvider(opts: LocalProviderOptions): LocalProvider {
  return new LocalProxyProvider(opts);
}

/** `local/<name>` → name; anything else is a permanent error (the ID can never become valid). */
export function parseLocalID(id: string, provider = LOCAL_PROVIDER_TYPE): string {
  const name = id.startsWith(LOCAL_ID_PREFIX) ? id.slice(LOCAL_ID_PREFIX.length) : '';
  if (!NAME_PATTERN.test(name)) {
    throw permanent(`${provider}: malformed providerID ${JSON.stringify(id)}, want local/<name>`, {
      provider,
      providerID: id,
    });
  }
  return name;
}

class LocalProxyProvider implements Provider, Checker {
  readonly name: string;
  readonly type = LOCAL_PROVIDER_TYPE;
  private readonly bindAddress: string;
  private readonly advertiseAddress: string;
  private readonly from: number;
  private readonly to: number;
  private readonly log: Logger;
  private readonly connectTimeoutMs: number | undefined;
  private readonly egress: EgressGuard;
  private readonly limits: Partial<ProxyLimits> | undefined;
  private readonly sharedCap: SharedConnectionCap | undefined;
  private readonly dial: LocalProviderOptions['dial'];
  private readonly leaseCredentials: LocalProviderOptions['leaseCredentials'];
  private readonly deniedTotal: Counter<'provider' | 'reason'> | undefined;
  private readonly droppedTotal: Counter<'provider'> | undefined;
  private readonly instances = new Map<string, Entry>();
  private readonly starting = new Map<string, Promise<Entry>>();
  /** Ports instances had, so a re-created instance gets its old port back when it is free. */
  private readonly lastPort = new Map<string, number>();
  /** The `egressAddresses` and who holds which; undefined when the system picks the source. */
  private readonly pool: EgressAddressPool | undefined;
  private readonly reservations: () => EgressReservation[];
  private readonly location: Location | undefined;
  private closed = false;

  constructor(opts: LocalProviderOptions) {
    const cfg = opts.config ?? {};
    this.name = opts.name;
    // buildProviders hands every provider a logger already bound to its name.
    this.log = opts.log ?? silentLogger();
    this.bindAddress = cfg.bindAddress ?? DEFAULT_LOCAL_BIND_ADDRESS;
    if (net.isIP(this.bindAddress) === 0) {
      throw new Error(
        `providers[${opts.name}].local.bindAddress: ${JSON.stringify(this.bindAddress)} is not an IP address`,
      );
    }
    if (cfg.advertiseAddress !== undefined && cfg.advertiseAddress.trim() === '') {
      throw new Error(`providers[${opts.name}].local.advertiseAddress: must not be empty`);
    }
    this.advertiseAddress = cfg.advertiseAddress ?? this.bindAddress;
    this.location = localLocation(opts.hostname ?? hostname());
    const range = cfg.portRange ?? DEFAULT_LOCAL_PORT_RANGE;
    for (const [field, v] of [
      ['from', range.from],
      ['to', range.to],
    ] as const) {
      if (!Number.isInteger(v) || v < 1 || v > 65535) {
        throw new Error(`providers[${opts.name}].local.portRange.${field}: ${v} is not a port (1-65535)`);
      }
    }
    if (range.from > range.to) {
      throw new Error(
        `providers[${opts.name}].local.portRange: from (${range.from}) must not be greater than to (${range.to})`,
      );
    }
    this.from = range.from;
    this.to = range.to;
    if (cfg.egressAddresses !== undefined) {
      const problem = egressAddressProblems(cfg.egressAddresses)[0];
      if (problem) {
        throw new Error(`providers[${opts.name}].local.egressAddresses${problem.field}: ${problem.message}`);
      }
      this.pool = new EgressAddressPool(expandEgressAddresses(cfg.egressAddresses));
    }
    this.reservations = opts.egressReservations ?? (() => []);
    this.connectTimeoutMs = opts.connectTimeoutMs;
    const own = new Set(opts.operator?.ports ?? []);
    const { from, to } = range;
    const names = opts.operator?.names;
    this.egress = new EgressGuard(
      resolveEgressPolicy(cfg.egressPolicy),
      {
        isOwnPort: (p) => own.has(p) || (p >= from && p <= to),
        describe: (p) =>
          names?.[p] ??
          (p >= from && p <= to ? `local proxy ports (providers[${opts.name}].local.portRange)` : undefined),
        ...(opts.operator?.probePort === undefined ? {} : { probePort: opts.operator.probePort }),
      },
      undefined,
      {
        field: `providers[${opts.name}].local.egressPolicy`,
        ...(cfg.egressPolicy ? { config: cfg.egressPolicy } : {}),
      },
    );
    this.limits = opts.limits;
    this.sharedCap = opts.sharedCap;
    this.dial = opts.dial;
    this.leaseCredentials = opts.leaseCredentials;
    if (opts.registry) {
      this.deniedTotal = counter(opts.registry, {
        name: 'proxy_operator_local_egress_denied_total',
        help: 'Requests the local proxies refused by egress policy, by reason (address, port, operator-port).',
        labelNames: ['provider', 'reason'],
      });
      this.droppedTotal = counter(opts.registry, {
        name: 'proxy_operator_local_connections_dropped_total',
        help: 'Connections a local proxy listener dropped because it already had its maximum open.',
        labelNames: ['provider'],
      });
    }
  }

  async create(ctx: CallContext, req: CreateRequest): Promise<Instance> {
    if (!NAME_PATTERN.test(req.name)) {
      throw permanent(
        `${this.name} create: invalid instance name ${JSON.stringify(req.name)}`,
        this.where('create'),
      );
    }
    if (this.closed) throw transient(`${this.name} create: provider is shut down`, this.where('create'));
    this.throwIfAborted(ctx, 'create', req.name);
    let entry = this.instances.get(req.name);
    if (!entry) {
      let pending = this.starting.get(req.name);
      if (!pending) {
        pending = this.start(ctx, req).finally(() => this.starting.delete(req.name));
        this.starting.set(req.name, pending);
      }
      entry = await pending;
    }
    // Like every backend: an instance name is idempotent for its own Proxy only.
    if (entry.uid !== req.uid) {
      throw permanent(
        `${this.name} create ${LOCAL_ID_PREFIX}${req.name}: a local proxy of that name exists and does not belong to this Proxy`,
        this.where('create'),
      );
    }
    return this.toInstance(entry);
  }

  async get(ctx: CallContext, providerID: string): Promise<Instance> {
    const name = parseLocalID(providerID, this.name);
    this.throwIfAborted(ctx, 'get', providerID);
    const entry = this.instances.get(name);
    if (!entry?.proxy.listening) {
      if (entry) await this.stop(entry);
      throw notFound(`${this.name} get ${providerID}: no such local proxy`, this.where('get', providerID));
    }
    return this.toInstance(entry);
  }

  async delete(ctx: CallContext, providerID: string): Promise<void> {
    const name = parseLocalID(providerID, this.name);
    this.throwIfAborted(ctx, 'delete', providerID);
    // A create still binding must not leave a listener behind the delete.
    await this.starting.get(name)?.catch(() => undefined);
    const entry = this.instances.get(name);
    if (entry) await this.stop(entry);
  }

  async listByTag(ctx: CallContext): Promise<Instance[]> {
    this.throwIfAborted(ctx, 'listByTag');
    return [...this.instances.values()].map((e) => this.toInstance(e));
  }

  async check(ctx: CallContext): Promise<TargetCheck[]> {
    const start = Date.now();
    const target: TargetCheck = {
      name: 'local',
      address: this.bindAddress,
      ready: false,
      reason: 'Unknown',
      details: {
        listeners: String(this.instances.size),
        portRange: `${this.from}-${this.to}`,
        ...(this.pool
          ? {
              egressAddresses: String(this.pool.addresses.length),
              egressAddressesFree: String(this.pool.free),
            }
          : {}),
      },
    };
    try {
      const broken = [...this.instances.values()].filter((e) => !e.proxy.listening).map((e) => e.name);
      const free = await this.probeFreePort(ctx.signal);
      if (ctx.signal.aborted) {
        target.reason = 'Timeout';
        target.message = 'check aborted before a free port was found';
      } else if (free.error) {
        target.reason = 'BindFailed';
        target.message = `cannot listen on ${this.bindAddress}: ${free.error}`;
      } else if (broken.length > 0) {
        target.reason = 'ListenerFailed';
        target.message = `not listening: ${broken.join(', ')}`.slice(0, 1024);
      } else if (!free.found) {
        target.reason = 'PortRangeExhausted';
        target.message = `no free port in ${this.from}-${this.to} on ${this.bindAddress}`;
      } else {
        target.ready = true;
        target.reason = 'PortsAvailable';
      }
    } catch (err) {
      target.reason = 'Unknown';
      target.message = errorMessage(err).slice(0, 1024);
    }
    target.latencyMillis = Math.max(0, Date.now() - start);
    return [target];
  }

  async close(): Promise<void> {
    this.closed = true;
    await Promise.allSettled([...this.starting.values()]);
    await Promise.all([...this.instances.values()].map((e) => this.stop(e)));
  }

  private async start(ctx: CallContext, req: CreateRequest): Promise<Entry> {
    const egressIP = this.takeEgressAddress(req);
    try {
      return await this.startOn(ctx, req, egressIP);
    } catch (err) {
      this.pool?.release(req.name);
      throw err;
    }
  }

  /** The source address of a new instance (`egressAddresses`); shared when none is free. */
  private takeEgressAddress(req: CreateRequest): string | undefined {
    if (!this.pool) return undefined;
    let reserved: EgressReservation[] = [];
    try {
      reserved = this.reservations();
    } catch (err) {
      this.log.warn({ err }, 'reading egress address reservations failed');
    }
    const choice = this.pool.take(req.name, req.uid, req.egressIP, reserved);
    if (choice.sharedWith > 0) {
      this.log.warn(
        { instance: req.name, egressIP: choice.address, sharedWith: choice.sharedWith },
        'more local proxies than egress addresses: this one shares its address (and its blocks)',
      );
    }
    return choice.address;
  }

  private async startOn(ctx: CallContext, req: CreateRequest, egressIP: string | undefined): Promise<Entry> {
    const taken = new Set([...this.instances.values()].map((e) => e.port));
    for (const port of portCandidates(
      req.name,
      [this.lastPort.get(req.name), req.port],
      { from: this.from, to: this.to },
      taken,
    )) {
      this.throwIfAborted(ctx, 'create', req.name);
      const id = `${LOCAL_ID_PREFIX}${req.name}`;
      const check = this.leaseCredentials;
      const proxy = new ForwardProxy({
        credentials: req.credentials,
        ...(check ? { leaseCredentials: (u: string, p: string) => check(id, u, p) } : {}),
        log: this.log.child({ instance: req.name }),
        ...(this.connectTimeoutMs === undefined ? {} : { connectTimeoutMs: this.connectTimeoutMs }),
        ...(this.dial ? { dial: this.dial } : {}),
        ...(egressIP === undefined ? {} : { localAddress: egressIP }),
        ...(this.limits ? { limits: this.limits } : {}),
        ...(this.sharedCap ? { sharedCap: this.sharedCap } : {}),
        egress: this.egress,
        onDenied: (reason) => this.deniedTotal?.inc({ provider: this.name, reason }),
        onDropped: () => this.droppedTotal?.inc({ provider: this.name }),
      });
      try {
        await proxy.listen(port, this.bindAddress);
      } catch (err) {
        await proxy.close();
        const code = (err as NodeJS.ErrnoException).code;
        if (code === 'EADDRINUSE') continue;
        if (code === 'EACCES') {
          throw permanent(
            `${this.name} create ${req.name}: not allowed to listen on ${this.bindAddress}:${port}; set providers[${this.name}].local.portRange above 1023`,
            this.where('create'),
          );
        }
        throw transient(
          `${this.name} create ${req.name}: cannot listen on ${this.bindAddress}:${port}: ${code}`,
          {
            ...this.where('create'),
            cause: err,
          },
        );
      }
      if (this.closed) {
        await proxy.close();
        throw transient(`${this.name} create: provider is shut down`, this.where('create'));
      }
      const entry: Entry = {
        name: req.name,
        proxy,
        port,
        ...(egressIP === undefined ? {} : { egressIP }),
        uid: req.uid,
        namespace: req.namespace,
        ...(req.installation ? { installation: req.installation } : {}),
        createdAt: new Date(),
      };
      this.instances.set(req.name, entry);
      this.lastPort.set(req.name, port);
      this.log.info(
        { instance: req.name, port, egressIP, proxy: `${req.namespace}/${req.proxyName}` },
        'local proxy started',
      );
      return entry;
    }
    throw quotaExceeded(
      `${this.name} create ${req.name}: no free port in ${this.from}-${this.to} on ${this.bindAddress} (another copy of the operator, or other programs, hold them); give this copy its own range with providers[${this.name}].local.portRange`,
      this.where('create'),
    );
  }

  /** Whether some port of the range not held by us can be bound right now. */
  private async probeFreePort(signal: AbortSignal): Promise<{ found: boolean; error?: string }> {
    const taken = new Set([...this.instances.values()].map((e) => e.port));
    const size = this.to - this.from + 1;
    for (let i = 0; i < size && !signal.aborted; i++) {
      const port = this.from + i;
      if (taken.has(port)) continue;
      const code = await tryBind(this.bindAddress, port);
      if (code === undefined) return { found: true };
      if (code !== 'EADDRINUSE') return { found: false, error: code };
    }
    return { found: false };
  }

  private async stop(entry: Entry): Promise<void> {
    if (this.instances.get(entry.name) === entry) {
      this.instances.delete(entry.name);
      this.pool?.release(entry.name);
    }
    await entry.proxy.close();
    this.log.info({ instance: entry.name, port: entry.port }, 'local proxy stopped');
  }

  private toInstance(e: Entry): Instance {
    return {
      id: `${LOCAL_ID_PREFIX}${e.name}`,
      name: e.name,
      state: 'Running',
      address: this.advertiseAddress,
      port: e.port,
      ...(e.egressIP === undefined ? {} : { egressIP: e.egressIP }),
      ...(this.location ? { location: { ...this.location } } : {}),
      uid: e.uid,
      namespace: e.namespace,
      ...(e.installation ? { installation: e.installation } : {}),
      createdAt: e.createdAt,
    };
  }

  /** A caller that gave up gets a Transient error, as from every backend, and nothing changes. */
  private throwIfAborted(ctx: CallContext, op: string, target?: string): void {
    if (!ctx.signal.aborted) return;
    throw transient(`${this.name} ${op}${target === undefined ? '' : ` ${target}`}: aborted`, {
      ...(op === 'create' ? this.where(op) : this.where(op, target)),
      cause: ctx.signal.reason,
    });
  }

  private where(op: string, providerID?: string) {
    return providerID === undefined ? { op, provider: this.name } : { op, provider: this.name, providerID };
  }
}
