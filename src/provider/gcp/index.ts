/**
 * provider/gcp — the `gcp` provider: each instance is a Compute Engine VM with an ephemeral
 * external IP, configured by cloud-init in its `user-data` metadata. Four API calls (insert,
 * get, delete, aggregatedList) through @google-cloud/compute's REST transport, plus stop and
 * start for `restart` (a new ephemeral IP in place: provider/gcp/restart). Inserts, deletes,
 * stops and starts are followed to their end (provider/gcp/operations): waited for a bounded time, then
 * checked on the next call about that instance, and an operation's error is thrown with GCE's
 * code. Optionally one managed firewall rule per proxy port (get/insert, once per port and process).
 *
 * Cancellation: google-gax calls take no AbortSignal, so every call is raced against ctx.signal
 * — the caller returns at once, the abandoned HTTP request ends at its own timeout.
 */
import { existsSync } from 'node:fs';
import type { Logger } from 'pino';
import { INSTANCE_LABEL_INSTALLATION } from '../../api/constants.ts';
import type { TargetCheck } from '../../api/providerhealth.ts';
import { type EgressPolicy, type OperatorEndpoints, resolveEgressPolicy } from '../../config/egress.ts';
import type { GcpProviderConfig } from '../../config/schema.ts';
import { silentLogger } from '../../log/index.ts';
import { systemClock } from '../../runtime/clock.ts';
import type { CallContext, Checker, CreateRequest, Instance, Provider } from '../contract.ts';
import { notFound, ProviderError, permanent } from '../errors.ts';
import { defaultCloudInit } from '../squid/cloud-init.ts';
import { type Clients, endpointOptions, type GcpClientOptions, LazyClients } from './clients.ts';
import { checkMessage, checkReason, parseError, raceSignal, toProviderError, type Where } from './errors.ts';
import { FirewallKeeper } from './firewall.ts';
import {
  buildInsertResource,
  type GceInstance,
  type GcpSettings,
  gcpLocation,
  gcpSettings,
  instanceFromGce,
  lastSegment,
  MANAGED_FILTER,
  parseProviderID,
  providerIDOf,
  requestProblems,
  sanitizeGcpLabelValue,
} from './instance.ts';
import { type GceOperation, OperationFollower } from './operations.ts';
import { Restarter } from './restart.ts';

export type { GcpClientOptions } from './clients.ts';

export const GCP_PROVIDER_TYPE = 'gcp';
export const COMPUTE_ADDRESS = 'compute.googleapis.com';
const DEFAULT_CALL_TIMEOUT_MS = 60_000;
/** How long create and delete wait for their operation before answering "still running". */
const DEFAULT_OPERATION_WAIT_MS = 10_000;
/** A followed operation nobody asked about for this long is forgotten. */
const OPERATION_KEEP_MS = 60 * 60_000;
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
   * How long create and delete wait for their zone operation (default 10 s); one still running
   * then is checked on the next call about that instance instead of being sent again.
   */
  operationWaitMs?: number;
  /** Time source of the operation bookkeeping (tests). */
  now?: () => number;
  /**
   * Full wire logging (`--gcp-wire-full-payloads`): each request and response at debug level,
   * bodies included with cloud-init and secret-like fields redacted. Off: no body is ever logged.
   */
  wireLog?: boolean;
  /** The operator's own listeners, denied in the default cloud-init (cmd/modes operatorEndpoints). */
  operator?: OperatorEndpoints;
}

export type GcpProvider = Provider &
  Checker & {
    close(): Promise<void>;
    adopt: NonNullable<Provider['adopt']>;
    restart: NonNullable<Provider['restart']>;
  };

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
  /** The operator's own listeners, denied in the default cloud-init's squid.conf. */
  private readonly operator: OperatorEndpoints | undefined;
  private readonly log: Logger;
  private readonly clientOptions: GcpClientOptions;
  private readonly timeout: number;
  private readonly pageSize: number;
  private readonly wireLog: boolean;
  private readonly lazy: LazyClients;
  private readonly firewall: FirewallKeeper;
  private readonly ops: OperationFollower;
  private readonly restarter: Restarter;

  constructor(opts: GcpProviderOptions) {
    this.name = opts.name;
    this.config = opts.config;
    this.settings = gcpSettings(opts.config);
    this.egress = resolveEgressPolicy(opts.config.egressPolicy);
    this.operator = opts.operator;
    this.log = opts.log ?? silentLogger();
    this.timeout = opts.callTimeoutMs ?? DEFAULT_CALL_TIMEOUT_MS;
    this.pageSize = opts.listPageSize ?? LIST_PAGE_SIZE;
    this.wireLog = opts.wireLog ?? false;
    this.clientOptions = { ...endpointOptions(opts.config.apiEndpoint), ...opts.clientOptions };
    this.lazy = new LazyClients({
      clientOptions: this.clientOptions,
      credentialsFile: this.config.credentialsFile,
      wireLog: this.wireLog,
      log: this.log,
    });
    this.firewall = new FirewallKeeper({
      settings: this.settings,
      log: this.log,
      callOpts: () => this.callOpts(),
      where: (op, id) => this.where(op, id),
    });
    this.ops = new OperationFollower({
      provider: this.name,
      waitMs: opts.operationWaitMs ?? DEFAULT_OPERATION_WAIT_MS,
      callTimeoutMs: this.timeout,
      keepMs: OPERATION_KEEP_MS,
      now: opts.now ?? (() => systemClock.now()),
      log: this.log,
    });
    this.restarter = new Restarter({
      provider: this.name,
      ops: this.ops,
      callOpts: () => this.callOpts(),
      log: this.log,
    });
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
    const userData = req.cloudInit ?? defaultCloudInit(req, { egress: this.egress, operator: this.operator });
    let resource: ReturnType<typeof buildInsertResource>;
    try {
      resource = buildInsertResource({ ...req, zone }, this.settings, userData);
    } catch (err) {
      throw permanent(`${this.name} create ${req.name}: ${(err as Error).message}`, this.where('create', id));
    }
    const secrets = [userData, req.credentials.password];
    const where = { ...this.where('create', id), secrets };
    const c = await this.client(ctx, 'create', id);
    const ref = { project: this.settings.project, zone, name: req.name };
    const location = gcpLocation(zone);
    const pending: Instance = {
      id,
      name: req.name,
      state: 'Pending',
      uid: req.uid,
      namespace: req.namespace,
      ...(location ? { location } : {}),
    };
    // An insert of this name GCE is still working on is followed, never sent a second time;
    // one that failed meanwhile is reported once, after which a create inserts anew.
    const followed = await this.ops.check(ctx, c, id, where);
    if (followed?.rec.kind === 'insert') {
      if (followed.state === 'failed') {
        this.ops.forget(id);
        if (!followed.rec.reported) throw followed.failure;
      } else if (followed.state === 'running') {
        return this.readOr(ctx, c, ref, 'create', pending);
      }
    }
    await this.firewall.ensure(ctx, c, req.port);
    let existed = false;
    try {
      const [accepted] = await raceSignal(
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
      const op = (accepted as { latestResponse?: GceOperation } | undefined)?.latestResponse;
      const rec = { kind: 'insert' as const, ref, uid: req.uid, namespace: req.namespace };
      await this.ops.settle(ctx, c, op, rec, where);
    } catch (err) {
      if (err instanceof ProviderError) throw err; // the operation's own error, or aborted
      // Already there (a retry after a crash or a lost answer): create is idempotent by name.
      if (parseError(err).http !== 409) throw toProviderError(err, where, ctx.signal);
      existed = true;
      ctx.log.debug({ instance: req.name, zone }, 'gcp instance already exists; reading it back');
    }
    if (!existed) {
      // The insert was accepted (or finished): a read that fails now — not visible yet,
      // throttled — must not turn a successful create into an error; the reconciler polls get.
      return this.readOr(ctx, c, ref, 'create', pending);
    }
    const inst = await this.read(ctx, c, ref, 'create');
    if (inst.uid !== undefined && inst.uid !== sanitizeGcpLabelValue(req.uid)) {
      throw permanent(
        `${this.name} create ${id}: an instance of that name exists and does not belong to this Proxy`,
        this.where('create', id),
      );
    }
    return inst;
  }

  /**
   * The instance as GCE has it. Missing while its insert is still running: Pending. Missing
   * because its insert failed: that operation's error once (by its class, `op: 'create'`), then
   * NotFound saying so, also with `op: 'create'` — an instance never created is not a lost one.
   */
  async get(ctx: CallContext, providerID: string): Promise<Instance> {
    const ref = parseProviderID(providerID, this.name);
    const c = await this.client(ctx, 'get', providerID);
    try {
      return await this.read(ctx, c, ref, 'get');
    } catch (err) {
      if (!(err instanceof ProviderError) || err.errorClass !== 'NotFound') throw err;
      const where = this.where('get', providerID);
      const followed = await this.ops.check(ctx, c, providerID, where);
      if (followed?.rec.kind !== 'insert') throw err;
      const { rec } = followed;
      if (followed.state === 'running') {
        return { id: providerID, name: ref.name, state: 'Pending', uid: rec.uid, namespace: rec.namespace };
      }
      if (followed.state === 'done') throw err; // created, then gone: really lost
      if (rec.reported) throw this.ops.neverCreated(rec, where);
      rec.reported = true;
      throw followed.failure;
    }
  }

  async delete(ctx: CallContext, providerID: string): Promise<void> {
    const ref = parseProviderID(providerID, this.name);
    const c = await this.client(ctx, 'delete', providerID);
    const where = this.where('delete', providerID);
    // A delete GCE is still working on is followed, not sent again; one that failed is
    // reported once, and the next call asks again.
    const followed = await this.ops.check(ctx, c, providerID, where);
    if (followed?.rec.kind === 'delete') {
      if (followed.state === 'running') return;
      this.ops.forget(providerID);
      if (followed.state === 'failed') throw followed.failure;
    }
    try {
      const [accepted] = await raceSignal(
        () =>
          c.instances.delete({ project: ref.project, zone: ref.zone, instance: ref.name }, this.callOpts()),
        ctx.signal,
      );
      this.log.info({ instance: ref.name, zone: ref.zone }, 'gcp instance delete accepted');
      const op = (accepted as { latestResponse?: GceOperation } | undefined)?.latestResponse;
      await this.ops.settle(ctx, c, op, { kind: 'delete', ref }, where);
    } catch (err) {
      if (err instanceof ProviderError) throw err;
      if (parseError(err).http !== 404) throw toProviderError(err, where, ctx.signal);
      // Not there (yet): an insert still running would make it appear later, so the caller
      // keeps polling; one that failed means it never will.
      if (followed?.rec.kind === 'insert') {
        if (followed.state === 'failed') followed.rec.reported = true;
        return;
      }
    }
  }

  /**
   * A new ephemeral external IP without a new VM: stop, then start (provider/gcp/restart). Each
   * call moves the restart on as far as GCE lets it within the operation wait, and answers the
   * instance as it is; Running with its new address once the restart named by `since` is done.
   */
  async restart(ctx: CallContext, providerID: string, since: Date): Promise<Instance> {
    const ref = parseProviderID(providerID, this.name);
    const c = await this.client(ctx, 'restart', providerID);
    return this.restarter.restart(ctx, c, ref, since);
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
   * relabelled in between answers 412 (Transient): the next orphan sweep tries again.
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
   * and the compute.instances.list permission the orphan sweep depends on, in a single request.
   */
  async check(ctx: CallContext): Promise<TargetCheck[]> {
    const start = Date.now();
    const target: TargetCheck = {
      name: this.settings.project,
      address: this.clientOptions.apiEndpoint ?? COMPUTE_ADDRESS,
      ready: false,
      reason: 'Unreachable',
    };
    try {
      const c = await this.client(ctx, 'check');
      // One zone whose backend is down does not fail this: the list asks for partial success
      // (clients.askPartialSuccess); the check answers for the credentials, the API and the
      // list permission, not for zones.
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

  close(): Promise<void> {
    return this.lazy.close();
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

  /** `read`, but `fallback` when the instance is not (yet) visible or the read fails. */
  private async readOr(
    ctx: CallContext,
    c: Clients,
    ref: { project: string; zone: string; name: string },
    op: string,
    fallback: Instance,
  ): Promise<Instance> {
    try {
      return await this.read(ctx, c, ref, op);
    } catch (err) {
      if (ctx.signal.aborted) throw err;
      return fallback;
    }
  }

  /** The compute clients, built on first use once credentials can be loaded. */
  private client(ctx: CallContext, op: string, providerID?: string): Promise<Clients> {
    return this.lazy.get(ctx.signal, this.where(op, providerID));
  }

  private callOpts() {
    return { retry: null, timeout: this.timeout };
  }

  private where(op: string, providerID?: string): Where {
    return providerID === undefined ? { op, provider: this.name } : { op, provider: this.name, providerID };
  }
}
