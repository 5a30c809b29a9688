/**
 * provider/aws — the `aws` provider: each instance is an EC2 instance with a public IPv4 and/or
 * IPv6 address, configured by the shared Squid cloud-init as its user data, through
 * @aws-sdk/client-ec2 (docs/providers/aws.md). Crash-safe creation: the deterministic instance
 * name is the Name tag, every tag is set in the RunInstances call itself, and its ClientToken is
 * derived from installation, Proxy, name and subnet, so a retried create returns the same
 * instance. Instances are found by their Name tag; listByTag lists every managed instance of
 * every region; `restart` stops and starts an instance for a new public IP. Quotas and
 * exhausted capacity are remembered for ProviderHealth (`check`).
 */
import {
  CreateTagsCommand,
  DescribeInstancesCommand,
  type EC2Client,
  type Instance as Ec2Instance,
  paginateDescribeInstances,
  RunInstancesCommand,
  StartInstancesCommand,
  StopInstancesCommand,
  TerminateInstancesCommand,
} from '@aws-sdk/client-ec2';
import { GetParameterCommand } from '@aws-sdk/client-ssm';
import type { Logger } from 'pino';
import { INSTANCE_LABEL_INSTALLATION, INSTANCE_LABEL_MANAGED } from '../../api/constants.ts';
import type { TargetCheck } from '../../api/providerhealth.ts';
import { type EgressPolicy, type OperatorEndpoints, resolveEgressPolicy } from '../../config/egress.ts';
import type { AwsProviderConfig, AwsRegion } from '../../config/schema.ts';
import { silentLogger } from '../../log/index.ts';
import type { CallContext, Checker, CreateRequest, Instance, Provider } from '../contract.ts';
import { notFound, ProviderError, permanent, quotaExceeded } from '../errors.ts';
import { defaultCloudInit } from '../squid/cloud-init.ts';
import { type AwsClientOptions, AwsClients } from './clients.ts';
import {
  abortedError,
  CAPACITY_CODES,
  checkMessage,
  checkReason,
  parseError,
  QUOTA_CODES,
  toProviderError,
  type Where,
} from './errors.ts';
import {
  type AwsSettings,
  awsSettings,
  buildRunInstancesInput,
  instanceFromEc2,
  LIVE_STATES,
  METADATA_CIDRS,
  NAME_TAG,
  parseProviderID,
  placementOf,
  providerIDOf,
  requestProblems,
  resolveImage,
  resolveInstanceType,
} from './instance.ts';
import { SecurityGroupKeeper } from './security-group.ts';

export type { AwsClientOptions } from './clients.ts';

export const AWS_PROVIDER_TYPE = 'aws';
/** How long a quota or capacity error keeps the region not ready in ProviderHealth. */
const QUOTA_MEMORY_MS = 15 * 60_000;
/** How long a resolved `ssm:` image is used before it is asked for again. */
const IMAGE_CACHE_MS = 60 * 60_000;

export interface AwsProviderOptions {
  name: string;
  config: AwsProviderConfig;
  log?: Logger;
  /** Overrides of the SDK client options (tests: static credentials, attempts). */
  clientOptions?: Partial<AwsClientOptions>;
  /** The operator's own listeners, denied in the default cloud-init (cmd/modes operatorEndpoints). */
  operator?: OperatorEndpoints;
  /** Time source of the quota memory and image cache (tests). */
  now?: () => number;
}

/** `restart` is absent on a spot provider: one-time spot instances cannot be stopped. */
export type AwsProvider = Provider &
  Checker & {
    close(): Promise<void>;
    adopt: NonNullable<Provider['adopt']>;
  };

export function createAwsProvider(opts: AwsProviderOptions): AwsProvider {
  return new Ec2Provider(opts);
}

/** Where the instance metadata service lives is never reachable through an AWS proxy. */
export function awsEgressPolicy(c: AwsProviderConfig): EgressPolicy {
  const p = c.egressPolicy ?? {};
  return resolveEgressPolicy({ ...p, denyCIDRs: [...(p.denyCIDRs ?? []), ...METADATA_CIDRS] });
}

class Ec2Provider implements Provider, Checker {
  readonly name: string;
  readonly type = AWS_PROVIDER_TYPE;
  private readonly settings: AwsSettings;
  private readonly egress: EgressPolicy;
  private readonly operator: OperatorEndpoints | undefined;
  private readonly log: Logger;
  private readonly clients: AwsClients;
  private readonly groups: SecurityGroupKeeper | undefined;
  private readonly endpoint: string | undefined;
  private readonly now: () => number;
  /** Last quota or capacity error by region: ProviderHealth shows it. */
  private readonly quota = new Map<string, { at: number; message: string }>();
  private readonly images = new Map<string, { at: number; id: Promise<string> }>();
  /** Restarts this process started, by providerID: their `since` and whether the start was sent. */
  private readonly restarts = new Map<string, { since: number; started: boolean }>();

  constructor(opts: AwsProviderOptions) {
    this.name = opts.name;
    this.settings = awsSettings(opts.config);
    this.egress = awsEgressPolicy(opts.config);
    this.operator = opts.operator;
    this.log = opts.log ?? silentLogger();
    this.endpoint = opts.config.endpoint;
    this.now = opts.now ?? Date.now;
    this.clients = new AwsClients({
      profile: opts.config.profile,
      endpoint: opts.config.endpoint,
      ...opts.clientOptions,
    });
    if (this.settings.spot) {
      // canRestart() must say no, so a pool with strategy: Restart is refused at admission
      // instead of failing each restart: an own property hides the prototype's method.
      Object.defineProperty(this, 'restart', { value: undefined });
    }
    this.groups = this.settings.sourceRanges
      ? new SecurityGroupKeeper({
          sourceRanges: this.settings.sourceRanges,
          log: this.log,
          where: (op, id) => this.where(op, id),
        })
      : undefined;
  }

  async create(ctx: CallContext, req: CreateRequest): Promise<Instance> {
    const problems = requestProblems(req);
    let placement: ReturnType<typeof placementOf> | undefined;
    let instanceType = '';
    let image = '';
    try {
      placement = placementOf(req.zone, this.settings);
      instanceType = resolveInstanceType(req.machineType, this.settings.instanceTypes);
      image = resolveImage(req.image, this.settings.images);
    } catch (err) {
      problems.push((err as Error).message);
    }
    const region = placement?.region.name ?? this.settings.regions[0]?.name ?? '';
    const id = providerIDOf({ region, name: req.name });
    if (problems.length > 0 || !placement) {
      throw permanent(`${this.name} create ${req.name}: ${problems.join('; ')}`, this.where('create', id));
    }
    const ec2 = this.ec2(ctx, 'create', id, region);
    // Already there (a retry after a crash or a lost answer): create is idempotent by name.
    const existing = await this.find(ctx, ec2, region, req.name, 'create');
    if (existing) {
      if (existing.uid !== undefined && existing.uid !== req.uid) {
        throw permanent(
          `${this.name} create ${id}: an instance of that name exists and does not belong to this Proxy`,
          this.where('create', id),
        );
      }
      return existing;
    }
    const userData = req.cloudInit ?? defaultCloudInit(req, { egress: this.egress, operator: this.operator });
    const where = { ...this.where('create', id), secrets: [userData, req.credentials.password] };
    const imageId = await this.imageId(ctx, region, image, where);
    const refused: string[] = [];
    for (const subnet of placement.subnets) {
      const groups = await this.securityGroups(ctx, ec2, placement.region, subnet.id, req.port);
      const input = buildRunInstancesInput({
        req,
        settings: this.settings,
        subnetId: subnet.id,
        imageId,
        instanceType,
        securityGroupIds: groups,
        userData,
      });
      try {
        if (ctx.signal.aborted) throw abortedError();
        const out = await ec2.send(new RunInstancesCommand(input), { abortSignal: ctx.signal });
        const inst = out.Instances?.[0];
        this.log.info(
          {
            instance: req.name,
            zone: subnet.zone,
            instanceId: inst?.InstanceId,
            proxy: `${req.namespace}/${req.proxyName}`,
            spot: this.settings.spot,
          },
          'aws instance started',
        );
        this.quota.delete(region);
        return inst
          ? instanceFromEc2(inst, region)
          : { id, name: req.name, state: 'Pending', uid: req.uid, namespace: req.namespace };
      } catch (err) {
        const code = parseError(err).code;
        if (code !== undefined && CAPACITY_CODES.has(code)) {
          // This zone has none of this type now: the next subnet (zone) may.
          refused.push(`${subnet.zone} (${subnet.id}): ${code}`);
          ctx.log.info(
            { instance: req.name, zone: subnet.zone, code },
            'aws: no capacity in zone; trying the next',
          );
          continue;
        }
        const pe = toProviderError(err, where, ctx.signal);
        if (code !== undefined && QUOTA_CODES.has(code))
          this.quota.set(region, { at: this.now(), message: pe.message });
        throw pe;
      }
    }
    const message = `${this.name} create ${id}: InsufficientInstanceCapacity in every zone tried: ${refused.join('; ')}`;
    this.quota.set(region, { at: this.now(), message });
    throw quotaExceeded(message, this.where('create', id));
  }

  async get(ctx: CallContext, providerID: string): Promise<Instance> {
    const ref = parseProviderID(providerID, this.name);
    const ec2 = this.ec2(ctx, 'get', providerID, ref.region);
    const inst = await this.find(ctx, ec2, ref.region, ref.name, 'get');
    if (!inst)
      throw notFound(`${this.name} get ${providerID}: instance not found`, this.where('get', providerID));
    return inst;
  }

  async delete(ctx: CallContext, providerID: string): Promise<void> {
    const ref = parseProviderID(providerID, this.name);
    const ec2 = this.ec2(ctx, 'delete', providerID, ref.region);
    const where = this.where('delete', providerID);
    // Every live instance of the name: a duplicate, should one ever exist, goes too.
    const ids = (await this.describeByName(ctx, ec2, ref.region, ref.name, 'delete'))
      .filter((i) => i.State?.Name !== 'shutting-down')
      .map((i) => i.InstanceId)
      .filter((i): i is string => Boolean(i));
    if (ids.length === 0) return;
    try {
      await ec2.send(new TerminateInstancesCommand({ InstanceIds: ids }), { abortSignal: ctx.signal });
      this.log.info(
        { instance: ref.name, region: ref.region, instanceIds: ids },
        'aws instance terminate accepted',
      );
    } catch (err) {
      if (parseError(err).code === 'InvalidInstanceID.NotFound') return;
      throw toProviderError(err, where, ctx.signal);
    }
  }

  async listByTag(ctx: CallContext): Promise<Instance[]> {
    const out: Instance[] = [];
    for (const r of this.settings.regions) {
      const ec2 = this.ec2(ctx, 'listByTag', undefined, r.name);
      try {
        if (ctx.signal.aborted) throw abortedError();
        const pages = paginateDescribeInstances(
          { client: ec2, pageSize: 500 },
          {
            Filters: [
              { Name: `tag:${INSTANCE_LABEL_MANAGED}`, Values: ['true'] },
              { Name: 'instance-state-name', Values: LIVE_STATES },
            ],
          },
        );
        for await (const page of pages) {
          if (ctx.signal.aborted) throw abortedError();
          for (const res of page.Reservations ?? [])
            for (const i of res.Instances ?? []) out.push(instanceFromEc2(i, r.name));
        }
      } catch (err) {
        throw toProviderError(err, this.where('listByTag'), ctx.signal);
      }
    }
    ctx.log.debug({ count: out.length }, 'aws managed instances listed');
    return out;
  }

  async adopt(ctx: CallContext, providerID: string, installation: string): Promise<void> {
    const ref = parseProviderID(providerID, this.name);
    const ec2 = this.ec2(ctx, 'adopt', providerID, ref.region);
    const ids = (await this.describeByName(ctx, ec2, ref.region, ref.name, 'adopt'))
      .map((i) => i.InstanceId)
      .filter((i): i is string => Boolean(i));
    const where = this.where('adopt', providerID);
    if (ids.length === 0) throw notFound(`${this.name} adopt ${providerID}: instance not found`, where);
    try {
      await ec2.send(
        new CreateTagsCommand({
          Resources: ids,
          Tags: [{ Key: INSTANCE_LABEL_INSTALLATION, Value: installation }],
        }),
        { abortSignal: ctx.signal },
      );
    } catch (err) {
      throw toProviderError(err, where, ctx.signal);
    }
  }

  /**
   * A new public IP without a new instance: stop, then start (EC2 releases an auto-assigned
   * public IPv4 address on stop and assigns a new one on start). Each call moves the restart on
   * as far as EC2 lets it and answers the instance as it is; Running with its new address once
   * the restart named by `since` is done. After an operator restart the memory of a restart in
   * flight is gone: a running instance whose LaunchTime (EC2: the last start) is at or after
   * `since` counts as restarted; anything else costs one more stop/start, never a missed one.
   */
  async restart(ctx: CallContext, providerID: string, since: Date): Promise<Instance> {
    const ref = parseProviderID(providerID, this.name);
    const where = this.where('restart', providerID);
    const sinceMs = since.getTime();
    if (Number.isNaN(sinceMs)) throw permanent(`${this.name} restart ${providerID}: invalid since`, where);
    let mine = this.restarts.get(providerID);
    if (mine && mine.since !== sinceMs) {
      this.restarts.delete(providerID);
      mine = undefined;
    }
    const ec2 = this.ec2(ctx, 'restart', providerID, ref.region);
    const raw = (await this.describeByName(ctx, ec2, ref.region, ref.name, 'restart'))[0];
    if (!raw?.InstanceId) throw notFound(`${this.name} restart ${providerID}: instance not found`, where);
    const inst = instanceFromEc2(raw, ref.region);
    const instanceId = raw.InstanceId;
    const send = async (kind: 'stop' | 'start') => {
      try {
        if (ctx.signal.aborted) throw abortedError();
        await ec2.send(
          kind === 'stop'
            ? new StopInstancesCommand({ InstanceIds: [instanceId] })
            : new StartInstancesCommand({ InstanceIds: [instanceId] }),
          { abortSignal: ctx.signal },
        );
        this.log.info({ instance: ref.name, instanceId }, `aws instance ${kind} accepted`);
      } catch (err) {
        if (parseError(err).code === 'InvalidInstanceID.NotFound') {
          throw notFound(`${this.name} restart ${providerID}: instance not found`, where);
        }
        throw toProviderError(err, where, ctx.signal);
      }
    };
    switch (raw.State?.Name) {
      case 'running': {
        const launched = raw.LaunchTime?.getTime() ?? Number.NaN;
        if (mine?.started || launched >= sinceMs) {
          if (inst.state === 'Running') this.restarts.delete(providerID);
          return inst;
        }
        this.restarts.set(providerID, { since: sinceMs, started: false });
        await send('stop');
        return this.readOr(ctx, ec2, ref.region, ref.name, { ...inst, state: 'Stopping' });
      }
      case 'stopped': {
        await send('start');
        this.restarts.set(providerID, { since: sinceMs, started: true });
        return this.readOr(ctx, ec2, ref.region, ref.name, { ...inst, state: 'Pending' });
      }
      case 'shutting-down':
      case 'terminated':
        throw notFound(`${this.name} restart ${providerID}: instance not found`, where);
      default:
        // pending (starting), stopping: EC2 is at it.
        return inst;
    }
  }

  /**
   * Per region: one page of at most five managed instances — the credentials, the endpoint and
   * the ec2:DescribeInstances permission in one request; a region whose last create met a quota
   * or no capacity in any zone is not ready, with the AWS code, for a while after.
   */
  async check(ctx: CallContext): Promise<TargetCheck[]> {
    const out: TargetCheck[] = [];
    for (const r of this.settings.regions) {
      const start = this.now();
      const target: TargetCheck = {
        name: r.name,
        address: this.endpoint ?? `ec2.${r.name}.amazonaws.com`,
        ready: false,
        reason: 'Unreachable',
      };
      try {
        const ec2 = this.clients.ec2For(r.name);
        await ec2.send(
          new DescribeInstancesCommand({
            MaxResults: 5,
            Filters: [{ Name: `tag:${INSTANCE_LABEL_MANAGED}`, Values: ['true'] }],
          }),
          { abortSignal: ctx.signal },
        );
        const q = this.quota.get(r.name);
        if (q && this.now() - q.at < QUOTA_MEMORY_MS) {
          target.reason = 'QuotaExceeded';
          target.message = q.message.slice(0, 1024);
        } else {
          target.ready = true;
          target.reason = 'Reachable';
        }
      } catch (err) {
        target.reason = checkReason(err, ctx.signal);
        target.message = checkMessage(err);
      }
      target.latencyMillis = Math.max(0, this.now() - start);
      out.push(target);
    }
    return out;
  }

  async close(): Promise<void> {
    this.clients.close();
  }

  // ---- internals ----------------------------------------------------------------------------

  private ec2(_ctx: CallContext, op: string, providerID: string | undefined, region: string): EC2Client {
    try {
      return this.clients.ec2For(region);
    } catch (err) {
      throw new ProviderError(
        'Transient',
        `${this.name} ${op}: ${(err as Error).message}`,
        this.where(op, providerID),
      );
    }
  }

  /** Live instances tagged with the name (normally one), oldest first. */
  private async describeByName(
    ctx: CallContext,
    ec2: EC2Client,
    region: string,
    name: string,
    op: string,
  ): Promise<Ec2Instance[]> {
    const id = providerIDOf({ region, name });
    try {
      if (ctx.signal.aborted) throw abortedError();
      const out = await ec2.send(
        new DescribeInstancesCommand({
          Filters: [
            { Name: `tag:${NAME_TAG}`, Values: [name] },
            { Name: `tag:${INSTANCE_LABEL_MANAGED}`, Values: ['true'] },
            { Name: 'instance-state-name', Values: LIVE_STATES },
          ],
        }),
        { abortSignal: ctx.signal },
      );
      const all = (out.Reservations ?? []).flatMap((r) => r.Instances ?? []);
      return all.sort((a, b) => (a.LaunchTime?.getTime() ?? 0) - (b.LaunchTime?.getTime() ?? 0));
    } catch (err) {
      throw toProviderError(err, this.where(op, id), ctx.signal);
    }
  }

  private async find(
    ctx: CallContext,
    ec2: EC2Client,
    region: string,
    name: string,
    op: string,
  ): Promise<Instance | undefined> {
    const live = (await this.describeByName(ctx, ec2, region, name, op)).filter(
      (i) => i.State?.Name !== 'shutting-down',
    );
    const first = live[0];
    return first ? instanceFromEc2(first, region) : undefined;
  }

  private async readOr(
    ctx: CallContext,
    ec2: EC2Client,
    region: string,
    name: string,
    fallback: Instance,
  ): Promise<Instance> {
    try {
      return (await this.find(ctx, ec2, region, name, 'restart')) ?? fallback;
    } catch (err) {
      if (ctx.signal.aborted) throw err;
      return fallback;
    }
  }

  private async securityGroups(
    ctx: CallContext,
    ec2: EC2Client,
    region: AwsRegion,
    subnetId: string,
    port: number,
  ): Promise<string[]> {
    if (region.securityGroupIds && region.securityGroupIds.length > 0) return region.securityGroupIds;
    if (!this.groups) return [];
    return [await this.groups.ensure(ctx, ec2, region.name, subnetId, port)];
  }

  /** An AMI ID as it is; `ssm:<parameter>` resolved through SSM, cached per region. */
  private async imageId(ctx: CallContext, region: string, image: string, where: Where): Promise<string> {
    if (!image.startsWith('ssm:')) return image;
    const key = `${region}/${image}`;
    const cached = this.images.get(key);
    if (cached && this.now() - cached.at < IMAGE_CACHE_MS) return cached.id;
    const name = image.slice('ssm:'.length);
    const id = (async () => {
      try {
        if (ctx.signal.aborted) throw abortedError();
        const out = await this.clients
          .ssmFor(region)
          .send(new GetParameterCommand({ Name: name }), { abortSignal: ctx.signal });
        const value = out.Parameter?.Value;
        if (!value || !/^ami-[0-9a-f]+$/.test(value)) {
          throw permanent(
            `${where.provider} ${where.op}: SSM parameter ${name} does not hold an AMI ID`,
            where,
          );
        }
        return value;
      } catch (err) {
        throw toProviderError(err, where, ctx.signal);
      }
    })();
    this.images.set(key, { at: this.now(), id });
    id.catch(() => this.images.delete(key));
    return id;
  }

  private where(op: string, providerID?: string): Where {
    return providerID === undefined ? { op, provider: this.name } : { op, provider: this.name, providerID };
  }
}
