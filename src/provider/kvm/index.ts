/**
 * provider/kvm — the `kvm` provider: each instance is a libvirt domain on one of the configured
 * hosts, reached over one pooled SSH connection per host. A VM is a qcow2 overlay on a cached
 * base image, a NoCloud seed ISO carrying the cloud-init, and a domain whose metadata records
 * the owning Proxy. Create is idempotent by name and resumes after a crash at any step: every
 * piece is looked up before it is made. Delete is idempotent; base images are immutable and
 * only an old one no overlay uses any more is removed (provider/kvm/image).
 */
import type { Logger } from 'pino';
import { type Location, locationOf } from '../../api/location.ts';
import type { TargetCheck } from '../../api/providerhealth.ts';
import { kvmWithDefaults } from '../../config/defaults.ts';
import { type EgressPolicy, type OperatorEndpoints, resolveEgressPolicy } from '../../config/egress.ts';
import type { KvmProviderConfig } from '../../config/schema.ts';
import { silentLogger } from '../../log/index.ts';
import type { CallContext, Checker, CreateRequest, Instance, Provider } from '../contract.ts';
import { notFound, permanent } from '../errors.ts';
import { defaultCloudInit } from '../squid/cloud-init.ts';
import { checkHost } from './check.ts';
import {
  type DomainID,
  domainXml,
  instanceState,
  KVM_NAME_PATTERN,
  overlayVolumeName,
  overlayVolumeXml,
  parseMetadata,
  parseProviderID,
  pickAddress,
  providerIDOf,
  rawVolumeXml,
  seedVolumeName,
} from './domain.ts';
import { ignoreCode, toProviderError } from './errors.ts';
import { ImageCache, resolveImage } from './image.ts';
import type { LibvirtConnection } from './libvirt.ts';
import {
  AddressSource,
  type DomainRef,
  DomainState,
  ErrorCode,
  isLibvirtError,
  type PoolRef,
  UndefineFlags,
  type VolRef,
} from './libvirt-protocol.ts';
import { type Host, resolveHost, resolveMachineType, type Settings } from './placement.ts';
import { HostPool } from './pool.ts';
import type { KeepaliveOptions } from './rpc.ts';
import { buildSeed } from './seed.ts';

export const KVM_PROVIDER_TYPE = 'kvm';

export interface KvmProviderOptions {
  name: string;
  config: KvmProviderConfig;
  log?: Logger;
  /**
   * Tests only: replaces the bridge NIC of every domain (a CI machine has no bridge). Not part
   * of the configuration on purpose.
   */
  interfaceXml?: string;
  /** libvirt URI on the hosts. Default qemu:///system. */
  uri?: string;
  /** Bounds one connection dial. Default 15 s. */
  dialTimeoutMs?: number;
  keepalive?: KeepaliveOptions | false;
  /** Image downloads (tests may inject). Default global fetch. */
  fetch?: typeof fetch;
  /** The operator's own listeners, denied in the default cloud-init (cmd/modes operatorEndpoints). */
  operator?: OperatorEndpoints;
}

export type KvmProvider = Provider & Checker & { close(): Promise<void> };

export function createKvmProvider(opts: KvmProviderOptions): KvmProvider {
  return new LibvirtProvider(opts);
}

/**
 * Where an instance on `host` runs: the host is the failure domain a KVM fleet has, so its
 * name (kvm.hosts[].name) is the zone; there is no region. A host name that is not a label
 * value gives no location.
 */
export function kvmLocation(host: string): Location | undefined {
  return locationOf(undefined, host);
}

class LibvirtProvider implements Provider, Checker {
  readonly name: string;
  readonly type = KVM_PROVIDER_TYPE;
  private readonly settings: Settings;
  /** Written into the default cloud-init's squid.conf. */
  private readonly egress: EgressPolicy;
  /** The operator's own listeners, denied in the default cloud-init's squid.conf. */
  private readonly operator: OperatorEndpoints | undefined;
  private readonly log: Logger;
  private readonly pool: HostPool;
  private readonly images: ImageCache;
  private readonly interfaceXml: string | undefined;
  /** Creates of one name run one after another (define would race otherwise). */
  private readonly creating = new Map<string, Promise<unknown>>();

  constructor(opts: KvmProviderOptions) {
    this.name = opts.name;
    this.settings = kvmWithDefaults(opts.config);
    this.egress = resolveEgressPolicy(opts.config.egressPolicy);
    this.operator = opts.operator;
    this.log = opts.log ?? silentLogger();
    this.interfaceXml = opts.interfaceXml;
    this.pool = new HostPool({
      hosts: this.settings.hosts.map((h) => ({
        name: h.name,
        address: h.address,
        user: h.user,
        socket: h.socket,
      })),
      sshKeyFile: this.settings.sshKeyFile,
      knownHostsFile: this.settings.knownHostsFile,
      insecureIgnoreHostKey: this.settings.insecureIgnoreHostKey,
      log: this.log,
      ...(opts.uri ? { uri: opts.uri } : {}),
      ...(opts.dialTimeoutMs ? { dialTimeoutMs: opts.dialTimeoutMs } : {}),
      ...(opts.keepalive !== undefined ? { keepalive: opts.keepalive } : {}),
    });
    this.images = new ImageCache({ log: this.log, ...(opts.fetch ? { fetch: opts.fetch } : {}) });
    void this.pool.preflight();
  }

  async create(ctx: CallContext, req: CreateRequest): Promise<Instance> {
    const host = resolveHost(this.name, this.settings.hosts, req);
    const id = providerIDOf({ host: host.name, name: req.name });
    const where = { op: 'create', provider: this.name, providerID: id };
    if (!KVM_NAME_PATTERN.test(req.name)) {
      throw permanent(
        `${this.name} create: instance name ${JSON.stringify(req.name)} must match ${KVM_NAME_PATTERN.source}`,
        where,
      );
    }
    const machine = resolveMachineType(this.name, this.settings.machineTypes, req, where);
    let image: ReturnType<typeof resolveImage>;
    try {
      image = resolveImage(this.settings.images, req.image);
    } catch (err) {
      throw permanent(`${this.name} create ${id}: ${(err as Error).message}`, where);
    }
    const key = id;
    const previous = this.creating.get(key) ?? Promise.resolve();
    const run = previous.catch(() => undefined).then(() => this.createSteps(ctx, req, host, image, machine));
    this.creating.set(key, run);
    try {
      return await run;
    } catch (err) {
      throw toProviderError(this.name, err, where, ctx.signal);
    } finally {
      if (this.creating.get(key) === run) this.creating.delete(key);
    }
  }

  private async createSteps(
    ctx: CallContext,
    req: CreateRequest,
    host: Host,
    image: ReturnType<typeof resolveImage>,
    machine: { vcpus: number; memoryMiB: number },
  ): Promise<Instance> {
    const signal = ctx.signal;
    const o = { signal };
    const conn = await this.pool.get(host.name, signal);

    // 1. The domain may exist already (a retry, or a crash after define): reuse it.
    let dom = await ignoreCode(conn.domainLookupByName(req.name, o), ErrorCode.NO_DOMAIN);
    if (dom) {
      const meta = parseMetadata(await conn.domainGetXmlDesc(dom, 0, o));
      if (!meta.managed || meta.uid !== req.uid) {
        throw permanent(
          `a domain named ${req.name} exists on ${host.name} and does not belong to this Proxy`,
        );
      }
      return this.ensureRunning(ctx, conn, host, dom);
    }

    // 2. Base image, overlay and seed in the host's pool; each reused when present. The base
    // is held until the overlay that references it exists, so no sweep can take it away.
    const pool = await conn.storagePoolLookupByName(host.pool, o);
    const overlayName = overlayVolumeName(req.name);
    await this.images.with(conn, host.name, pool, image, signal, async (base) => {
      const overlay = await ignoreCode(
        conn.storageVolLookupByName(pool, overlayName, o),
        ErrorCode.NO_STORAGE_VOL,
      );
      if (overlay) return;
      const xml = overlayVolumeXml({
        name: overlayName,
        capacityGb: this.settings.diskSizeGb,
        backingPath: base.path,
        backingFormat: base.format,
      });
      await ignoreCode(conn.storageVolCreateXml(pool, xml, 0, o), ErrorCode.STORAGE_VOL_EXIST);
    });
    await this.sweepBases(conn, host.name, pool, signal);
    await this.ensureSeed(conn, pool, req, signal);

    // 3. Define and start.
    const xml = domainXml({
      name: req.name,
      domainType: this.settings.domainType,
      firmware: image.firmware,
      vcpus: machine.vcpus,
      memoryMiB: machine.memoryMiB,
      pool: host.pool,
      overlayVolume: overlayName,
      seedVolume: seedVolumeName(req.name),
      bridge: host.bridge,
      ...(image.directBoot ? { directBoot: image.directBoot } : {}),
      ...(this.interfaceXml !== undefined ? { interfaceXml: this.interfaceXml } : {}),
      metadata: {
        uid: req.uid,
        namespace: req.namespace,
        proxyName: req.proxyName,
        ...(req.installation ? { installation: req.installation } : {}),
        createdAt: new Date(),
      },
    });
    dom = await conn.domainDefineXml(xml, 0, o);
    this.log.info(
      { instance: req.name, host: host.name, proxy: `${req.namespace}/${req.proxyName}` },
      'kvm domain defined',
    );
    return this.ensureRunning(ctx, conn, host, dom);
  }

  /**
   * The seed ISO, written whenever the domain is not defined yet: its bytes may differ from an
   * earlier attempt (a fresh password-hash salt), and a crash may have left it half written.
   */
  private async ensureSeed(conn: LibvirtConnection, pool: PoolRef, req: CreateRequest, signal: AbortSignal) {
    const o = { signal };
    const userData = req.cloudInit ?? defaultCloudInit(req, { egress: this.egress, operator: this.operator });
    const seed = buildSeed({
      instanceId: req.name,
      hostname: req.name.toLowerCase().replace(/[^a-z0-9-]/g, '-'),
      userData,
      ...(this.settings.vendorData !== undefined ? { vendorData: this.settings.vendorData } : {}),
      installGuestAgent: this.settings.installGuestAgent,
    });
    const name = seedVolumeName(req.name);
    let vol: VolRef | undefined = await ignoreCode(
      conn.storageVolLookupByName(pool, name, o),
      ErrorCode.NO_STORAGE_VOL,
    );
    if (vol && (await conn.storageVolGetInfo(vol, o)).capacity !== seed.iso.length) {
      await ignoreCode(conn.storageVolDelete(vol, 0, o), ErrorCode.NO_STORAGE_VOL);
      vol = undefined;
    }
    vol ??= await conn.storageVolCreateXml(pool, rawVolumeXml(name, seed.iso.length), 0, o);
    await conn.storageVolUpload(vol, seed.iso, o);
  }

  private async ensureRunning(
    ctx: CallContext,
    conn: LibvirtConnection,
    host: Host,
    dom: DomainRef,
  ): Promise<Instance> {
    const o = { signal: ctx.signal };
    const { state } = await conn.domainGetState(dom, o);
    if (state === DomainState.SHUTOFF || state === DomainState.CRASHED || state === DomainState.NOSTATE) {
      // Already running (a concurrent start) is fine.
      await ignoreCode(conn.domainCreate(dom, 0, o), ErrorCode.OPERATION_INVALID);
      this.log.info({ instance: dom.name, host: host.name }, 'kvm domain started');
    }
    return this.read(conn, host.name, dom, ctx.signal);
  }

  async get(ctx: CallContext, providerID: string): Promise<Instance> {
    const ref = parseProviderID(providerID, this.name);
    const where = { op: 'get', provider: this.name, providerID };
    if (!this.pool.has(ref.host)) {
      throw permanent(`${this.name} get ${providerID}: host ${ref.host} is not configured`, where);
    }
    try {
      const conn = await this.pool.get(ref.host, ctx.signal);
      const dom = await this.lookup(conn, ref, ctx.signal);
      return await this.read(conn, ref.host, dom, ctx.signal);
    } catch (err) {
      throw toProviderError(this.name, err, where, ctx.signal);
    }
  }

  async delete(ctx: CallContext, providerID: string): Promise<void> {
    const ref = parseProviderID(providerID, this.name);
    const where = { op: 'delete', provider: this.name, providerID };
    const host = this.settings.hosts.find((h) => h.name === ref.host);
    if (!host) {
      // Nothing of ours can exist on a host we do not manage; blocking deletion would be worse.
      ctx.log.warn({ providerID }, 'kvm delete: host is not configured; nothing to delete');
      return;
    }
    const o = { signal: ctx.signal };
    try {
      const conn = await this.pool.get(ref.host, ctx.signal);
      const dom = await ignoreCode(conn.domainLookupByName(ref.name, o), ErrorCode.NO_DOMAIN);
      if (dom) {
        const meta = parseMetadata(await conn.domainGetXmlDesc(dom, 0, o));
        if (!meta.managed) {
          throw permanent(`${this.name} delete ${providerID}: domain is not managed by this operator`, where);
        }
        // Destroying one that is not running, or is gone meanwhile, is fine.
        await ignoreCode(conn.domainDestroy(dom, 0, o), ErrorCode.OPERATION_INVALID, ErrorCode.NO_DOMAIN);
        await ignoreCode(conn.domainUndefine(dom, UndefineFlags.NVRAM, o), ErrorCode.NO_DOMAIN);
        this.log.info({ instance: ref.name, host: ref.host }, 'kvm domain removed');
      }
      const pool = await ignoreCode(conn.storagePoolLookupByName(host.pool, o), ErrorCode.NO_STORAGE_POOL);
      if (!pool) return;
      for (const name of [overlayVolumeName(ref.name), seedVolumeName(ref.name)]) {
        const vol = await ignoreCode(conn.storageVolLookupByName(pool, name, o), ErrorCode.NO_STORAGE_VOL);
        if (vol) await ignoreCode(conn.storageVolDelete(vol, 0, o), ErrorCode.NO_STORAGE_VOL);
      }
      // This may have been the last VM on an old base image.
      await this.sweepBases(conn, ref.host, pool, ctx.signal);
    } catch (err) {
      throw toProviderError(this.name, err, where, ctx.signal);
    }
  }

  /**
   * Removes old bases of the configured images that no overlay uses any more. Best effort:
   * a failure only leaves a base behind until the next create or delete on that host.
   */
  private async sweepBases(conn: LibvirtConnection, host: string, pool: PoolRef, signal: AbortSignal) {
    try {
      const images = Object.keys(this.settings.images).map((k) => resolveImage(this.settings.images, k));
      await this.images.sweep(conn, host, pool, images, signal);
    } catch (err) {
      if (signal.aborted) return;
      this.log.warn({ err, host }, 'kvm: sweeping old base images failed; trying again later');
    }
  }

  async listByTag(ctx: CallContext): Promise<Instance[]> {
    const where = { op: 'listByTag', provider: this.name };
    const perHost = await Promise.all(
      this.settings.hosts.map(async (h) => {
        try {
          return await this.listHost(h.name, ctx.signal);
        } catch (err) {
          // One host missing from the sweep must fail it: the orphan sweep would otherwise see its VMs as gone.
          throw toProviderError(this.name, err, { ...where, providerID: `hosts/${h.name}` }, ctx.signal);
        }
      }),
    );
    return perHost.flat();
  }

  private async listHost(host: string, signal: AbortSignal): Promise<Instance[]> {
    const o = { signal };
    const conn = await this.pool.get(host, signal);
    const out: Instance[] = [];
    for (const dom of await conn.listAllDomains(0, o)) {
      const xml = await ignoreCode(conn.domainGetXmlDesc(dom, 0, o), ErrorCode.NO_DOMAIN);
      if (xml === undefined) continue;
      const meta = parseMetadata(xml);
      if (!meta.managed) continue;
      const st = await ignoreCode(conn.domainGetState(dom, o), ErrorCode.NO_DOMAIN);
      if (!st) continue;
      out.push(this.instance(host, dom.name, instanceState(st.state, false), undefined, meta));
    }
    return out;
  }

  async check(ctx: CallContext): Promise<TargetCheck[]> {
    return Promise.all(
      this.settings.hosts.map((h) =>
        checkHost(this.pool, { name: h.name, address: h.address, user: h.user, pool: h.pool }, ctx.signal),
      ),
    );
  }

  async close(): Promise<void> {
    this.images.close();
    await this.pool.close();
  }

  // ---- internals ----------------------------------------------------------------------------

  private async lookup(conn: LibvirtConnection, ref: DomainID, signal: AbortSignal): Promise<DomainRef> {
    const dom = await ignoreCode(conn.domainLookupByName(ref.name, { signal }), ErrorCode.NO_DOMAIN);
    if (!dom) throw notFound(`domain ${ref.name} not found on ${ref.host}`);
    return dom;
  }

  private async read(conn: LibvirtConnection, host: string, dom: DomainRef, signal: AbortSignal) {
    const o = { signal };
    const { state } = await conn.domainGetState(dom, o);
    const meta = parseMetadata(await conn.domainGetXmlDesc(dom, 0, o));
    let address: string | undefined;
    if (state === DomainState.RUNNING || state === DomainState.BLOCKED) {
      address = await this.address(conn, dom, signal);
    }
    return this.instance(host, dom.name, instanceState(state, address !== undefined), address, meta);
  }

  /** From the guest agent first, then the host's ARP table; neither answering is no address yet. */
  private async address(conn: LibvirtConnection, dom: DomainRef, signal: AbortSignal) {
    for (const source of [AddressSource.AGENT, AddressSource.ARP]) {
      try {
        const addr = pickAddress(await conn.domainInterfaceAddresses(dom, source, { signal }));
        if (addr) return addr;
      } catch (err) {
        if (signal.aborted || !isLibvirtError(err)) throw err;
        // No agent yet (the guest is booting) or no ARP entry: try the next source.
      }
    }
    return undefined;
  }

  private instance(
    host: string,
    name: string,
    state: Instance['state'],
    address: string | undefined,
    meta: ReturnType<typeof parseMetadata>,
  ): Instance {
    const inst: Instance = { id: providerIDOf({ host, name }), name, state };
    if (address) inst.address = address;
    const location = kvmLocation(host);
    if (location) inst.location = location;
    if (meta.uid) inst.uid = meta.uid;
    if (meta.namespace) inst.namespace = meta.namespace;
    if (meta.installation) inst.installation = meta.installation;
    if (meta.createdAt) inst.createdAt = meta.createdAt;
    return inst;
  }
}
