/**
 * provider/gcp — the `gcp` provider: each instance is a Compute Engine VM with an ephemeral
 * external IP, configured by cloud-init in its `user-data` metadata. Four API calls (insert,
 * get, delete, aggregatedList) through @google-cloud/compute's REST transport, fire-and-forget:
 * the reconciler polls `get` instead of waiting on operations. Optionally one managed firewall
 * rule per proxy port (get/insert, once per port and process).
 *
 * Cancellation: google-gax calls take no AbortSignal, so every call is raced against ctx.signal
 * — the caller returns at once, the abandoned HTTP request ends at its own timeout.
 */
import { existsSync } from 'node:fs';
import type { Logger } from 'pino';
import { INSTANCE_LABEL_INSTALLATION } from '../../api/constants.ts';
import type { TargetStatus } from '../../api/providerhealth.ts';
import { type EgressPolicy, resolveEgressPolicy } from '../../config/egress.ts';
import type { GcpProviderConfig } from '../../config/schema.ts';
import { silentLogger } from '../../log/index.ts';
import type { CallContext, Checker, CreateRequest, Instance, Provider } from '../contract.ts';
import { notFound, ProviderError, permanent, transient } from '../errors.ts';
import { defaultCloudInit } from '../squid/cloud-init.ts';
import { buildClients, type Clients, endpointOptions, type GcpClientOptions } from './clients.ts';
import { checkMessage, checkReason, parseError, raceSignal, toProviderError, type Where } from './errors.ts';
import { buildFirewallRule, ruleMatches } from './firewall.ts';
import {
  buildInsertResource,
  type GceInstance,
  type GcpSettings,
  gcpSettings,
  instanceFromGce,
  lastSegment,
  MANAGED_FILTER,
  parseProviderID,
  providerIDOf,
  requestProblems,
  sanitizeGcpLabelValue,
} from './instance.ts';

export type { GcpClientOptions } from './clients.ts';

export const GCP_PROVIDER_TYPE = 'gcp';
export const COMPUTE_ADDRESS = 'compute.googleapis.com';
const DEFAULT_CALL_TIMEOUT_MS = 60_000;
/** Instances per aggregatedList page in listByTag (GCE's maximum). */
const LIST_PAGE_SIZE = 500;

export interface GcpProviderOptions {
  name: string;
  config: GcpProviderConfig;
  log?: Logger;
  /** Overrides of the compute client options; an `authClient` here replaces credentials loading. */
  clientOptions?: GcpClientOptions;
  /** Deadline of each API call (default 60 s); ctx.signal may end it sooner. */
  callTimeoutMs?: number;
  /** Instances per aggregatedList page in listByTag (default 500, GCE's maximum). */
  listPageSize?: number;
  /**
   * Full wire logging (`--gcp-wire-full-payloads`): each request and response at debug level,
   * bodies included with cloud-init and secret-like fields redacted. Off: no body is ever logged.
   */
  wireLog?: boolean;
}

export type GcpProvider = Provider &
  Checker & { close(): Promise<void>; adopt: NonNullable<Provider['adopt']> };

export function createGcpProvider(opts: GcpProviderOptions): GcpProvider {
  return new GceProvider(opts);
}

class GceProvider implements Provider, Checker {
  readonly name: string;
  readonly type = GCP_PROVIDER_TYPE;
  private readonly config: GcpProviderConfig;
  private readonly settings: GcpSettings;
  /** Written into the default cloud-init's squid.conf. */
  private readonly egress: EgressPolicy;
  private readonly log: Logger;
  private readonly clientOptions: GcpClientOptions;
  private readonly timeout: number;
  private readonly pageSize: number;
  private readonly wireLog: boolean;
  private clients: Clients | undefined;
  private building: Promise<Clients> | undefined;
  /** Firewall rules known to exist, by port (a failed ensure is retried on the next create). */
  private readonly firewallReady = new Map<number, Promise<void>>();
  private closed = false;

  constructor(opts: GcpProviderOptions) {
    this.name = opts.name;
    this.config = opts.config;
    this.settings = gcpSettings(opts.config);
    this.egress = resolveEgressPolicy(opts.config.egressPolicy);
    this.log = opts.log ?? silentLogger();
    this.timeout = opts.callTimeoutMs ?? DEFAULT_CALL_TIMEOUT_MS;
    this.pageSize = opts.listPageSize ?? LIST_PAGE_SIZE;
    this.wireLog = opts.wireLog ?? false;
    this.clientOptions = { ...endpointOptions(opts.config.apiEndpoint), ...opts.clientOptions };
    const file = opts.config.credentialsFile;
    if (file && !this.clientOptions.authClient && !existsSync(file)) {
      // A Secret mount may appear later: calls fail (transient) until it does.
      this.log.warn(
        { credentialsFile: file },
        'gcp credentials file does not exist yet; calls fail until it appears',
      );
    }
  }

  async create(ctx: CallContext, req: CreateRequest): Promise<Instance> {
    const problems = requestProblems(req);
    const zone = req.zone ?? '';
    const id = providerIDOf({ project: this.settings.project, zone, name: req.name });
    if (problems.length > 0) {
      throw permanent(`${this.name} create ${req.name}: ${problems.join('; ')}`, this.where('create', id));
    }
    const userData = req.cloudInit ?? defaultCloudInit(req, { egress: this.egress });
    let resource: ReturnType<typeof buildInsertResource>;
    try {
      resource = buildInsertResource({ ...req, zone }, this.settings, userData);
    } catch (err) {
      throw permanent(`${this.name} create ${req.name}: ${(err as Error).message}`, this.where('create', id));
    }
    const secrets = [userData, req.credentials.password];
    const c = await this.client(ctx, 'create', id);
    await this.ensureFirewall(ctx, c, req.port);
    let existed = false;
    try {
      await raceSignal(
        () =>
          c.instances.insert(
            { project: this.settings.project, zone, instanceResource: resource },
            this.callOpts(),
          ),
        ctx.signal,
      );
      this.log.info(
        { instance: req.name, zone, proxy: `${req.namespace}/${req.proxyName}`, spot: this.settings.spot },
        'gcp instance insert accepted',
      );
    } catch (err) {
      // Already there (a retry after a crash or a lost answer): create is idempotent by name.
      if (parseError(err).http !== 409) {
        throw toProviderError(err, { ...this.where('create', id), secrets }, ctx.signal);
      }
      existed = true;
      ctx.log.debug({ instance: req.name, zone }, 'gcp instance already exists; reading it back');
    }
    // Fire-and-forget: the operation is not awaited; a fresh read gives what exists now.
    const pending: Instance = {
      id,
      name: req.name,
      state: 'Pending',
      uid: req.uid,
      namespace: req.namespace,
    };
    let inst: Instance;
    try {
      inst = await this.read(ctx, c, { project: this.settings.project, zone, name: req.name }, 'create');
    } catch (err) {
      // The insert was accepted (or the VM is there): a read that fails now — not visible yet,
      // throttled — must not turn a successful create into an error; the reconciler polls get.
      if (!existed || (err instanceof ProviderError && err.errorClass === 'NotFound')) return pending;
      throw err;
    }
    if (existed && inst.uid !== undefined && inst.uid !== sanitizeGcpLabelValue(req.uid)) {
      throw permanent(
        `${this.name} create ${id}: an instance of that name exists and does not belong to this Proxy`,
        this.where('create', id),
      );
    }
    return inst;
  }

  async get(ctx: CallContext, providerID: string): Promise<Instance> {
    const ref = parseProviderID(providerID, this.name);
    const c = await this.client(ctx, 'get', providerID);
    return this.read(ctx, c, ref, 'get');
  }

  async delete(ctx: CallContext, providerID: string): Promise<void> {
    const ref = parseProviderID(providerID, this.name);
    const c = await this.client(ctx, 'delete', providerID);
    try {
      await raceSignal(
        () =>
          c.instances.delete({ project: ref.project, zone: ref.zone, instance: ref.name }, this.callOpts()),
        ctx.signal,
      );
      this.log.info({ instance: ref.name, zone: ref.zone }, 'gcp instance delete accepted');
    } catch (err) {
      if (parseError(err).http !== 404)
        throw toProviderError(err, this.where('delete', providerID), ctx.signal);
    }
  }

  async listByTag(ctx: CallContext): Promise<Instance[]> {
    const c = await this.client(ctx, 'listByTag');
    const out: Instance[] = [];
    try {
      await this.eachScope(ctx, c, this.pageSize, (scope, instances, warning) => {
        if (warning && warning !== 'NO_RESULTS_ON_PAGE') {
          // e.g. UNREACHABLE: a zone did not answer; its instances are missing from this sweep.
          this.log.warn({ scope, warning }, 'gcp aggregated list: scope reported a warning');
        }
        const zone = scope.startsWith('zones/') ? scope.slice('zones/'.length) : undefined;
        for (const inst of instances) out.push(instanceFromGce(inst, this.settings.project, zone));
        return true;
      });
    } catch (err) {
      throw toProviderError(err, this.where('listByTag'), ctx.signal);
    }
    ctx.log.debug({ count: out.length }, 'gcp managed instances listed');
    return out;
  }

  /**
   * Adds the installation label to a VM created before installations existed: a read for the
   * label fingerprint (GCE's optimistic lock), then setLabels with every label kept. A VM
   * relabelled in between answers 412 (Transient): the next GC sweep tries again.
   */
  async adopt(ctx: CallContext, providerID: string, installation: string): Promise<void> {
    const ref = parseProviderID(providerID, this.name);
    const c = await this.client(ctx, 'adopt', providerID);
    const where = this.where('adopt', providerID);
    try {
      const [inst] = await raceSignal(
        () => c.instances.get({ project: ref.project, zone: ref.zone, instance: ref.name }, this.callOpts()),
        ctx.signal,
      );
      const labels = { ...inst.labels, [INSTANCE_LABEL_INSTALLATION]: sanitizeGcpLabelValue(installation) };
      await raceSignal(
        () =>
          c.instances.setLabels(
            {
              project: ref.project,
              zone: ref.zone,
              instance: ref.name,
              instancesSetLabelsRequestResource: { labels, labelFingerprint: inst.labelFingerprint ?? null },
            },
            this.callOpts(),
          ),
        ctx.signal,
      );
    } catch (err) {
      if (parseError(err).http === 404)
        throw notFound(`${this.name} adopt ${providerID}: instance not found`, where);
      throw toProviderError(err, where, ctx.signal);
    }
  }

  /**
   * One page of at most one managed instance project-wide: the credentials, the Compute API
   * and the compute.instances.list permission GC depends on, in a single request.
   */
  async check(ctx: CallContext): Promise<TargetStatus[]> {
    const start = Date.now();
    const target: TargetStatus = {
      name: this.settings.project,
      address: this.clientOptions.apiEndpoint ?? COMPUTE_ADDRESS,
      ready: false,
      reason: 'Unreachable',
    };
    try {
      const c = await this.client(ctx, 'check');
      await this.eachScope(ctx, c, 1, () => false);
      target.ready = true;
      target.reason = 'Reachable';
    } catch (err) {
      if (err instanceof ProviderError) {
        // Credentials not loadable (the only ProviderError here): no request was made.
        target.reason = ctx.signal.aborted ? 'Timeout' : 'Unreachable';
        target.message = err.message.slice(0, 1024);
      } else {
        target.reason = checkReason(err, ctx.signal);
        target.message = checkMessage(err);
      }
    }
    target.latencyMillis = Math.max(0, Date.now() - start);
    return [target];
  }

  async close(): Promise<void> {
    this.closed = true;
    const c = this.clients ?? (await this.building?.catch(() => undefined));
    this.clients = undefined;
    if (c) await c.close();
  }

  // ---- internals ----------------------------------------------------------------------------

  /**
   * Walks the aggregated list of managed instances; `visit` returns false to stop (check).
   * Empty scopes come with a NO_RESULTS_ON_PAGE warning and no instances. Each step of the
   * lazy iterator (one page request at most) is raced against the signal.
   */
  private async eachScope(
    ctx: CallContext,
    c: Clients,
    pageSize: number,
    visit: (scope: string, instances: GceInstance[], warning: string | undefined) => boolean,
  ): Promise<void> {
    const it = c.instances
      .aggregatedListAsync(
        { project: this.settings.project, filter: MANAGED_FILTER, maxResults: pageSize },
        { ...this.callOpts(), autoPaginate: false },
      )
      [Symbol.asyncIterator]();
    for (;;) {
      const step = await raceSignal(() => it.next(), ctx.signal);
      if (step.done) return;
      const [scope, scoped] = step.value;
      const warning = scoped.warning?.code ?? undefined;
      if (!visit(scope, (scoped.instances ?? []) as GceInstance[], warning ?? undefined)) return;
    }
  }

  private async read(
    ctx: CallContext,
    c: Clients,
    ref: { project: string; zone: string; name: string },
    op: string,
  ): Promise<Instance> {
    const id = providerIDOf(ref);
    let inst: GceInstance;
    try {
      [inst] = await raceSignal(
        () => c.instances.get({ project: ref.project, zone: ref.zone, instance: ref.name }, this.callOpts()),
        ctx.signal,
      );
    } catch (err) {
      if (parseError(err).http === 404) {
        throw notFound(`${this.name} ${op} ${id}: instance not found`, this.where(op, id));
      }
      throw toProviderError(err, this.where(op, id), ctx.signal);
    }
    return instanceFromGce(inst, ref.project, lastSegment(inst.zone) || ref.zone);
  }

  /** Creates the port's firewall rule unless it exists; once per port and process. */
  private async ensureFirewall(ctx: CallContext, c: Clients, port: number): Promise<void> {
    const fw = this.settings.firewall;
    if (!fw) return;
    let ready = this.firewallReady.get(port);
    if (!ready) {
      ready = this.createFirewall(ctx, c, port, fw.sourceRanges);
      this.firewallReady.set(port, ready);
      ready.catch(() => this.firewallReady.delete(port));
    }
    await raceSignal(ready, ctx.signal);
  }

  private async createFirewall(ctx: CallContext, c: Clients, port: number, ranges: string[]): Promise<void> {
    const rule = buildFirewallRule(this.settings, port, ranges);
    const project = this.settings.project;
    const where = this.where('create', `projects/${project}/global/firewalls/${rule.name}`);
    try {
      const [existing] = await raceSignal(
        () => c.firewalls().get({ project, firewall: rule.name }, this.callOpts()),
        ctx.signal,
      );
      if (!ruleMatches(existing, rule)) {
        this.log.warn(
          { firewall: rule.name, want: rule.sourceRanges },
          'gcp firewall rule exists with other source ranges or tags; leaving it as it is',
        );
      }
      return;
    } catch (err) {
      if (parseError(err).http !== 404) throw toProviderError(err, where, ctx.signal);
    }
    try {
      await raceSignal(
        () => c.firewalls().insert({ project, firewallResource: rule }, this.callOpts()),
        ctx.signal,
      );
      this.log.info(
        { firewall: rule.name, port, sourceRanges: rule.sourceRanges },
        'gcp firewall rule created',
      );
    } catch (err) {
      if (parseError(err).http !== 409) throw toProviderError(err, where, ctx.signal);
    }
  }

  /** The compute clients, built on first use once credentials can be loaded. */
  private async client(ctx: CallContext, op: string, providerID?: string): Promise<Clients> {
    if (this.clients) return this.clients;
    if (this.closed) throw transient(`${this.name} ${op}: provider is closed`, this.where(op, providerID));
    if (!this.building) {
      const p = buildClients({
        clientOptions: this.clientOptions,
        credentialsFile: this.config.credentialsFile,
        wireLog: this.wireLog,
        log: this.log,
        isClosed: () => this.closed,
      });
      this.building = p;
      p.then(
        (c) => {
          this.clients = c;
        },
        () => {
          this.building = undefined;
        },
      );
    }
    try {
      return await raceSignal(this.building, ctx.signal);
    } catch (err) {
      if (err instanceof ProviderError) {
        throw new ProviderError(
          err.errorClass,
          `${this.name} ${op}: ${err.message}`,
          this.where(op, providerID),
        );
      }
      throw toProviderError(err, this.where(op, providerID), ctx.signal);
    }
  }

  private callOpts() {
    return { retry: null, timeout: this.timeout };
  }

  private where(op: string, providerID?: string): Where {
    return providerID === undefined ? { op, provider: this.name } : { op, provider: this.name, providerID };
  }
}
