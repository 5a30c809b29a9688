/**
 * provider/kvm/libvirt — the typed libvirt calls the kvm provider needs, each one an XDR encoding
 * of its `remote_*_args`, a procedure number from libvirt's remote_protocol.x, and a decoding of
 * its `remote_*_ret`. One LibvirtConnection wraps one RpcClient (one socket or SSH channel).
 * The protocol's numbers and shared structures live in libvirt-protocol.ts.
 */
import type { Duplex } from 'node:stream';
import type { Logger } from '../../log/index.ts';
import type { Clock } from '../../runtime/clock.ts';
import {
  AuthType,
  type DomainInterface,
  type DomainRef,
  type DomainStateInfo,
  decodeAll,
  ErrorCode,
  FEATURE_PROGRAM_KEEPALIVE,
  type PoolInfo,
  type PoolRef,
  Proc,
  readDomain,
  readPool,
  readVol,
  safeNumber,
  type VolInfo,
  type VolRef,
  writeDomain,
  writePool,
  writeVol,
} from './libvirt-protocol.ts';
import { type CallOptions, type KeepaliveOptions, LibvirtError, RpcClient } from './rpc.ts';
import { XdrWriter } from './xdr.ts';

export {
  AddressSource,
  AuthType,
  type DomainInterface,
  type DomainRef,
  DomainState,
  type DomainStateInfo,
  DomainXmlFlags,
  ErrorCode,
  formatVersion,
  type IpAddress,
  isLibvirtError,
  ListDomainsFlags,
  POOL_STATE_NAMES,
  type PoolInfo,
  type PoolRef,
  PoolState,
  Proc,
  UndefineFlags,
  uuidString,
  type VolInfo,
  type VolRef,
} from './libvirt-protocol.ts';

/** What a trace line says about a call's arguments: names, flags, sizes. */
type TraceDetail = Record<string, string | number | boolean | null | undefined>;

/** `ok`, `aborted`, libvirt's error code, or the transport's failure. */
function outcomeOf(err: unknown): string {
  if (err instanceof LibvirtError) return `libvirt error ${err.code}`;
  if (err instanceof Error && (err.name === 'AbortError' || err.name === 'TimeoutError')) return 'aborted';
  return err instanceof Error ? err.name : 'error';
}

export interface OpenOptions {
  /** Driver URI on the far side, e.g. qemu:///system. */
  uri?: string;
  signal?: AbortSignal | undefined;
  logger?: Logger;
  clock?: Clock;
  keepalive?: KeepaliveOptions | false;
  label?: string;
}

export class LibvirtConnection {
  readonly rpc: RpcClient;

  constructor(rpc: RpcClient) {
    this.rpc = rpc;
  }

  /**
   * Speaks the connection handshake on `stream`: auth list (only "none" is supported — the
   * socket's unix permissions are the authorization), the keepalive feature (so libvirtd pings
   * us and answers our pings), then CONNECT_OPEN. Closes the stream if any step fails.
   */
  static async open(stream: Duplex, opts: OpenOptions = {}): Promise<LibvirtConnection> {
    const rpc = new RpcClient(stream, {
      ...(opts.logger ? { logger: opts.logger } : {}),
      ...(opts.clock ? { clock: opts.clock } : {}),
      ...(opts.keepalive !== undefined ? { keepalive: opts.keepalive } : {}),
      ...(opts.label ? { label: opts.label } : {}),
    });
    const conn = new LibvirtConnection(rpc);
    const o = { signal: opts.signal };
    try {
      const auth = await conn.authList(o);
      if (auth.length > 0 && !auth.includes(AuthType.NONE)) {
        throw new LibvirtError({
          code: ErrorCode.AUTH_FAILED,
          domain: 0,
          level: 2,
          message: `libvirtd requires authentication (${auth.join(',')}); only socket permissions (auth "none") are supported`,
        });
      }
      await conn.supportsFeature(FEATURE_PROGRAM_KEEPALIVE, o);
      await conn.connectOpen(opts.uri ?? 'qemu:///system', 0, o);
      return conn;
    } catch (err) {
      rpc.close();
      throw err;
    }
  }

  get isOpen(): boolean {
    return this.rpc.isOpen;
  }

  onClose(fn: (err: Error | undefined) => void): () => void {
    return this.rpc.onClose(fn);
  }

  /** CONNECT_CLOSE, bounded by `timeoutMs`, then closes the transport whatever happened. */
  async close(timeoutMs = 2000): Promise<void> {
    if (!this.rpc.isOpen) return;
    try {
      await this.invoke('close', Proc.CONNECT_CLOSE, undefined, { signal: AbortSignal.timeout(timeoutMs) });
    } catch {
      // closing anyway
    } finally {
      this.rpc.close();
    }
  }

  /**
   * Every call of this API, one debug line when it settles (answered, failed or abandoned, with
   * its duration) and its arguments one level deeper: a guest agent that never answers shows
   * up as `domainInterfaceAddresses` lines ending in `aborted` after the whole timeout.
   * `detail` holds names and sizes only — never XML, volume bytes or anything from cloud-init.
   */
  private async traced<T>(call: string, detail: TraceDetail, run: () => Promise<T>): Promise<T> {
    const log = this.rpc.log;
    const started = this.rpc.clock.now();
    if (log.isLevelEnabled('trace')) log.trace({ libvirtCall: call, ...detail }, 'libvirt call');
    try {
      const out = await run();
      log.debug(
        { libvirtCall: call, durationMs: this.rpc.clock.now() - started, outcome: 'ok' },
        'libvirt call',
      );
      return out;
    } catch (err) {
      log.debug(
        { libvirtCall: call, durationMs: this.rpc.clock.now() - started, outcome: outcomeOf(err) },
        'libvirt call',
      );
      throw err;
    }
  }

  private invoke(
    call: string,
    proc: number,
    args: XdrWriter | undefined,
    opts: CallOptions | undefined,
    detail: TraceDetail = {},
  ): Promise<Buffer> {
    return this.traced(call, detail, () => this.rpc.call(proc, args?.bytes(), opts));
  }

  private async invokeVoid(
    call: string,
    proc: number,
    args: XdrWriter | undefined,
    opts: CallOptions | undefined,
    detail: TraceDetail = {},
  ): Promise<void> {
    const body = await this.invoke(call, proc, args, opts, detail);
    decodeAll(body, () => undefined);
  }

  // --- connection ---

  async authList(opts?: CallOptions): Promise<number[]> {
    const body = await this.invoke('authList', Proc.AUTH_LIST, undefined, opts);
    return decodeAll(body, (r) => r.array((x) => x.int(), 20));
  }

  async supportsFeature(feature: number, opts?: CallOptions): Promise<boolean> {
    const body = await this.invoke(
      'supportsFeature',
      Proc.CONNECT_SUPPORTS_FEATURE,
      new XdrWriter().int(feature),
      opts,
      {
        feature,
      },
    );
    return decodeAll(body, (r) => r.int() !== 0);
  }

  async connectOpen(uri: string | null, flags: number, opts?: CallOptions): Promise<void> {
    const w = new XdrWriter().optional(uri, (x, s) => x.string(s)).uint(flags);
    await this.invokeVoid('connectOpen', Proc.CONNECT_OPEN, w, opts, { uri });
  }

  async getHostname(opts?: CallOptions): Promise<string> {
    const body = await this.invoke('getHostname', Proc.CONNECT_GET_HOSTNAME, undefined, opts);
    return decodeAll(body, (r) => r.string());
  }

  /** libvirt's own version, packed (use formatVersion). */
  async getLibVersion(opts?: CallOptions): Promise<number> {
    const body = await this.invoke('getLibVersion', Proc.CONNECT_GET_LIB_VERSION, undefined, opts);
    return decodeAll(body, (r) => safeNumber(r.uhyper()));
  }

  /** The hypervisor's (QEMU's) version, packed (use formatVersion). */
  async getVersion(opts?: CallOptions): Promise<number> {
    const body = await this.invoke('getVersion', Proc.CONNECT_GET_VERSION, undefined, opts);
    return decodeAll(body, (r) => safeNumber(r.uhyper()));
  }

  async getCapabilities(opts?: CallOptions): Promise<string> {
    const body = await this.invoke('getCapabilities', Proc.CONNECT_GET_CAPABILITIES, undefined, opts);
    return decodeAll(body, (r) => r.string());
  }

  // --- storage pools ---

  async storagePoolLookupByName(name: string, opts?: CallOptions): Promise<PoolRef> {
    const body = await this.invoke(
      'storagePoolLookupByName',
      Proc.STORAGE_POOL_LOOKUP_BY_NAME,
      new XdrWriter().string(name),
      opts,
      {
        pool: name,
      },
    );
    return decodeAll(body, readPool);
  }

  async storagePoolGetInfo(pool: PoolRef, opts?: CallOptions): Promise<PoolInfo> {
    const w = new XdrWriter();
    writePool(w, pool);
    const body = await this.invoke('storagePoolGetInfo', Proc.STORAGE_POOL_GET_INFO, w, opts, {
      pool: pool.name,
    });
    return decodeAll(body, (r) => ({
      state: r.uint(), // `unsigned char` travels as a full XDR word
      capacity: safeNumber(r.uhyper()),
      allocation: safeNumber(r.uhyper()),
      available: safeNumber(r.uhyper()),
    }));
  }

  async storagePoolIsActive(pool: PoolRef, opts?: CallOptions): Promise<boolean> {
    const w = new XdrWriter();
    writePool(w, pool);
    const body = await this.invoke('storagePoolIsActive', Proc.STORAGE_POOL_IS_ACTIVE, w, opts, {
      pool: pool.name,
    });
    return decodeAll(body, (r) => r.int() !== 0);
  }

  async storagePoolRefresh(pool: PoolRef, opts?: CallOptions): Promise<void> {
    const w = new XdrWriter();
    writePool(w, pool);
    w.uint(0);
    await this.invokeVoid('storagePoolRefresh', Proc.STORAGE_POOL_REFRESH, w, opts, { pool: pool.name });
  }

  async storagePoolListAllVolumes(pool: PoolRef, opts?: CallOptions): Promise<VolRef[]> {
    const w = new XdrWriter();
    writePool(w, pool);
    w.int(1).uint(0);
    const body = await this.invoke('storagePoolListAllVolumes', Proc.STORAGE_POOL_LIST_ALL_VOLUMES, w, opts, {
      pool: pool.name,
    });
    return decodeAll(body, (r) => {
      const vols = r.array(readVol);
      r.uint();
      return vols;
    });
  }

  // --- storage volumes ---

  async storageVolLookupByName(pool: PoolRef, name: string, opts?: CallOptions): Promise<VolRef> {
    const w = new XdrWriter();
    writePool(w, pool);
    w.string(name);
    const body = await this.invoke('storageVolLookupByName', Proc.STORAGE_VOL_LOOKUP_BY_NAME, w, opts, {
      pool: pool.name,
      vol: name,
    });
    return decodeAll(body, readVol);
  }

  async storageVolCreateXml(pool: PoolRef, xml: string, flags = 0, opts?: CallOptions): Promise<VolRef> {
    const w = new XdrWriter();
    writePool(w, pool);
    w.string(xml).uint(flags);
    const body = await this.invoke('storageVolCreateXml', Proc.STORAGE_VOL_CREATE_XML, w, opts, {
      pool: pool.name,
      xmlBytes: Buffer.byteLength(xml),
      flags,
    });
    return decodeAll(body, readVol);
  }

  async storageVolDelete(vol: VolRef, flags = 0, opts?: CallOptions): Promise<void> {
    const w = new XdrWriter();
    writeVol(w, vol);
    w.uint(flags);
    await this.invokeVoid('storageVolDelete', Proc.STORAGE_VOL_DELETE, w, opts, { vol: vol.name, flags });
  }

  async storageVolGetInfo(vol: VolRef, opts?: CallOptions): Promise<VolInfo> {
    const w = new XdrWriter();
    writeVol(w, vol);
    const body = await this.invoke('storageVolGetInfo', Proc.STORAGE_VOL_GET_INFO, w, opts, {
      vol: vol.name,
    });
    return decodeAll(body, (r) => ({
      type: r.int(), // `char` travels as a full XDR word
      capacity: safeNumber(r.uhyper()),
      allocation: safeNumber(r.uhyper()),
    }));
  }

  /** The volume's XML, with its `<backingStore>` (how overlays name their base image). */
  async storageVolGetXmlDesc(vol: VolRef, opts?: CallOptions): Promise<string> {
    const w = new XdrWriter();
    writeVol(w, vol);
    w.uint(0);
    const body = await this.invoke('storageVolGetXmlDesc', Proc.STORAGE_VOL_GET_XML_DESC, w, opts, {
      vol: vol.name,
    });
    return decodeAll(body, (r) => r.string());
  }

  async storageVolGetPath(vol: VolRef, opts?: CallOptions): Promise<string> {
    const w = new XdrWriter();
    writeVol(w, vol);
    const body = await this.invoke('storageVolGetPath', Proc.STORAGE_VOL_GET_PATH, w, opts, {
      vol: vol.name,
    });
    return decodeAll(body, (r) => r.string());
  }

  /**
   * Writes `data` into the volume from `offset` (length 0 = up to the end of the data).
   * libvirt neither truncates a shorter upload nor enforces the volume's capacity.
   */
  async storageVolUpload(
    vol: VolRef,
    data: Uint8Array | AsyncIterable<Uint8Array> | Iterable<Uint8Array>,
    opts: CallOptions & { offset?: number; length?: number } = {},
  ): Promise<void> {
    const w = new XdrWriter();
    writeVol(w, vol);
    w.uhyper(opts.offset ?? 0)
      .uhyper(opts.length ?? 0)
      .uint(0);
    await this.traced('storageVolUpload', { vol: vol.name, offset: opts.offset ?? 0 }, () =>
      this.rpc.upload(Proc.STORAGE_VOL_UPLOAD, w.bytes(), data, opts),
    );
  }

  /** Streams the volume's bytes from `offset` (length 0 = to the end). */
  storageVolDownload(
    vol: VolRef,
    opts: CallOptions & { offset?: number; length?: number } = {},
  ): AsyncGenerator<Buffer> {
    const w = new XdrWriter();
    writeVol(w, vol);
    w.uhyper(opts.offset ?? 0)
      .uhyper(opts.length ?? 0)
      .uint(0);
    return this.tracedStream('storageVolDownload', { vol: vol.name, offset: opts.offset ?? 0 }, () =>
      this.rpc.download(Proc.STORAGE_VOL_DOWNLOAD, w.bytes(), opts),
    );
  }

  /** `traced` for a download: the line comes when the stream ends, fails or is given up. */
  private async *tracedStream(
    call: string,
    detail: TraceDetail,
    open: () => AsyncGenerator<Buffer>,
  ): AsyncGenerator<Buffer> {
    let outcome = 'ok';
    let bytes = 0;
    const log = this.rpc.log;
    const started = this.rpc.clock.now();
    if (log.isLevelEnabled('trace')) log.trace({ libvirtCall: call, ...detail }, 'libvirt call');
    try {
      for await (const chunk of open()) {
        bytes += chunk.length;
        yield chunk;
      }
    } catch (err) {
      outcome = outcomeOf(err);
      throw err;
    } finally {
      log.debug(
        { libvirtCall: call, durationMs: this.rpc.clock.now() - started, outcome, bytes },
        'libvirt call',
      );
    }
  }

  // --- domains ---

  async domainDefineXml(xml: string, flags = 0, opts?: CallOptions): Promise<DomainRef> {
    const body = await this.invoke(
      'domainDefineXml',
      Proc.DOMAIN_DEFINE_XML_FLAGS,
      new XdrWriter().string(xml).uint(flags),
      opts,
      { xmlBytes: Buffer.byteLength(xml), flags },
    );
    return decodeAll(body, readDomain);
  }

  async domainLookupByName(name: string, opts?: CallOptions): Promise<DomainRef> {
    const body = await this.invoke(
      'domainLookupByName',
      Proc.DOMAIN_LOOKUP_BY_NAME,
      new XdrWriter().string(name),
      opts,
      {
        domain: name,
      },
    );
    return decodeAll(body, readDomain);
  }

  /** Starts a defined domain; returns the reference with its new id. */
  async domainCreate(dom: DomainRef, flags = 0, opts?: CallOptions): Promise<DomainRef> {
    const w = new XdrWriter();
    writeDomain(w, dom);
    w.uint(flags);
    const body = await this.invoke('domainCreate', Proc.DOMAIN_CREATE_WITH_FLAGS, w, opts, {
      domain: dom.name,
      flags,
    });
    return decodeAll(body, readDomain);
  }

  /** Hard power-off. */
  async domainDestroy(dom: DomainRef, flags = 0, opts?: CallOptions): Promise<void> {
    const w = new XdrWriter();
    writeDomain(w, dom);
    w.uint(flags);
    await this.invokeVoid('domainDestroy', Proc.DOMAIN_DESTROY_FLAGS, w, opts, { domain: dom.name, flags });
  }

  /** Graceful shutdown request (ACPI or agent, per flags); returns before the guest is off. */
  async domainShutdown(dom: DomainRef, flags = 0, opts?: CallOptions): Promise<void> {
    const w = new XdrWriter();
    writeDomain(w, dom);
    w.uint(flags);
    await this.invokeVoid('domainShutdown', Proc.DOMAIN_SHUTDOWN_FLAGS, w, opts, { domain: dom.name, flags });
  }

  async domainUndefine(dom: DomainRef, flags = 0, opts?: CallOptions): Promise<void> {
    const w = new XdrWriter();
    writeDomain(w, dom);
    w.uint(flags);
    await this.invokeVoid('domainUndefine', Proc.DOMAIN_UNDEFINE_FLAGS, w, opts, { domain: dom.name, flags });
  }

  async domainGetState(dom: DomainRef, opts?: CallOptions): Promise<DomainStateInfo> {
    const w = new XdrWriter();
    writeDomain(w, dom);
    w.uint(0);
    const body = await this.invoke('domainGetState', Proc.DOMAIN_GET_STATE, w, opts, { domain: dom.name });
    return decodeAll(body, (r) => ({ state: r.int(), reason: r.int() }));
  }

  async domainIsActive(dom: DomainRef, opts?: CallOptions): Promise<boolean> {
    const w = new XdrWriter();
    writeDomain(w, dom);
    const body = await this.invoke('domainIsActive', Proc.DOMAIN_IS_ACTIVE, w, opts, { domain: dom.name });
    return decodeAll(body, (r) => r.int() !== 0);
  }

  async domainGetXmlDesc(dom: DomainRef, flags = 0, opts?: CallOptions): Promise<string> {
    const w = new XdrWriter();
    writeDomain(w, dom);
    w.uint(flags);
    const body = await this.invoke('domainGetXmlDesc', Proc.DOMAIN_GET_XML_DESC, w, opts, {
      domain: dom.name,
      flags,
    });
    return decodeAll(body, (r) => r.string());
  }

  async domainInterfaceAddresses(
    dom: DomainRef,
    source: number,
    opts?: CallOptions,
  ): Promise<DomainInterface[]> {
    const w = new XdrWriter();
    writeDomain(w, dom);
    w.uint(source).uint(0);
    const body = await this.invoke('domainInterfaceAddresses', Proc.DOMAIN_INTERFACE_ADDRESSES, w, opts, {
      domain: dom.name,
      source,
    });
    return decodeAll(body, (r) =>
      r.array((x) => ({
        name: x.string(),
        hwaddr: x.optional((y) => y.string()),
        addrs: x.array((y) => ({ type: y.int(), addr: y.string(), prefix: y.uint() })),
      })),
    );
  }

  async listAllDomains(flags = 0, opts?: CallOptions): Promise<DomainRef[]> {
    const body = await this.invoke(
      'listAllDomains',
      Proc.CONNECT_LIST_ALL_DOMAINS,
      new XdrWriter().int(1).uint(flags),
      opts,
      {
        flags,
      },
    );
    return decodeAll(body, (r) => {
      const doms = r.array(readDomain);
      r.uint();
      return doms;
    });
  }
}
