/**
 * provider/kvm/rpc — a libvirt RPC client over any byte stream (a unix socket, or an SSH channel
 * forwarded to libvirt-sock): packet framing, concurrent calls matched by serial, typed error
 * replies, the keepalive program (answer PINGs, send our own, declare a silent peer dead),
 * per-call cancellation that leaves the connection usable, and data streams for volume
 * upload/download.
 */
import type { Duplex } from 'node:stream';
import type { Logger } from '../../log/index.ts';
import { silentLogger } from '../../log/index.ts';
import { type Clock, systemClock, type TimerHandle } from '../../runtime/clock.ts';
import { XdrReader, XdrWriter } from './xdr.ts';

export const REMOTE_PROGRAM = 0x20008086;
export const REMOTE_PROTOCOL_VERSION = 1;
export const KEEPALIVE_PROGRAM = 0x6b656570;
export const KEEPALIVE_PROTOCOL_VERSION = 1;
export const KEEPALIVE_PROC_PING = 1;
export const KEEPALIVE_PROC_PONG = 2;

/** virNetMessageType */
export const MessageType = {
  Call: 0,
  Reply: 1,
  Message: 2,
  Stream: 3,
  CallWithFds: 4,
  ReplyWithFds: 5,
} as const;
/** virNetMessageStatus */
export const MessageStatus = { Ok: 0, Error: 1, Continue: 2 } as const;

/** The length word plus the six header words. */
export const HEADER_SIZE = 28;
/** Largest packet libvirt (≥ 6.x: 32 MiB payload) will send us, including the length word. */
export const MAX_PACKET_SIZE = 32 * 1024 * 1024 + 4;
/** libvirt's own client never puts more than this into one stream packet. */
export const STREAM_CHUNK_SIZE = 256 * 1024;

export interface Header {
  prog: number;
  vers: number;
  proc: number;
  type: number;
  serial: number;
  status: number;
}

export interface Packet {
  header: Header;
  body: Buffer;
}

export function encodePacket(h: Header, body: Uint8Array = Buffer.alloc(0)): Buffer {
  const out = Buffer.allocUnsafe(HEADER_SIZE + body.length);
  out.writeUInt32BE(HEADER_SIZE + body.length, 0);
  out.writeUInt32BE(h.prog >>> 0, 4);
  out.writeUInt32BE(h.vers >>> 0, 8);
  out.writeInt32BE(h.proc, 12);
  out.writeInt32BE(h.type, 16);
  out.writeUInt32BE(h.serial >>> 0, 20);
  out.writeInt32BE(h.status, 24);
  out.set(body, HEADER_SIZE);
  return out;
}

/** Reassembles packets from arbitrarily split chunks. */
export class PacketDecoder {
  private chunks: Buffer[] = [];
  private buffered = 0;

  push(chunk: Buffer): Packet[] {
    this.chunks.push(chunk);
    this.buffered += chunk.length;
    const out: Packet[] = [];
    for (;;) {
      if (this.buffered < 4) break;
      const head = this.peek(4);
      const len = head.readUInt32BE(0);
      if (len < HEADER_SIZE || len > MAX_PACKET_SIZE) {
        throw new RpcProtocolError(`invalid packet length ${len}`);
      }
      if (this.buffered < len) break;
      const pkt = this.take(len);
      out.push({
        header: {
          prog: pkt.readUInt32BE(4),
          vers: pkt.readUInt32BE(8),
          proc: pkt.readInt32BE(12),
          type: pkt.readInt32BE(16),
          serial: pkt.readUInt32BE(20),
          status: pkt.readInt32BE(24),
        },
        body: pkt.subarray(HEADER_SIZE),
      });
    }
    return out;
  }

  private peek(n: number): Buffer {
    if (this.chunks[0]!.length < n) this.chunks = [Buffer.concat(this.chunks)];
    return this.chunks[0]!;
  }

  private take(n: number): Buffer {
    if (this.chunks[0]!.length < n) this.chunks = [Buffer.concat(this.chunks)];
    const first = this.chunks[0]!;
    const out = first.subarray(0, n);
    if (first.length === n) this.chunks.shift();
    else this.chunks[0] = first.subarray(n);
    this.buffered -= n;
    return out;
  }
}

/** An error libvirtd reported (virNetMessageError). `code`/`domain` are virErrorNumber/virErrorDomain. */
export class LibvirtError extends Error {
  readonly code: number;
  readonly domain: number;
  readonly level: number;
  readonly str1: string | null;
  readonly str2: string | null;
  readonly str3: string | null;
  readonly int1: number;
  readonly int2: number;

  constructor(fields: {
    code: number;
    domain: number;
    message: string | null;
    level: number;
    str1?: string | null;
    str2?: string | null;
    str3?: string | null;
    int1?: number;
    int2?: number;
  }) {
    super(fields.message ?? `libvirt error code ${fields.code}`);
    this.name = 'LibvirtError';
    this.code = fields.code;
    this.domain = fields.domain;
    this.level = fields.level;
    this.str1 = fields.str1 ?? null;
    this.str2 = fields.str2 ?? null;
    this.str3 = fields.str3 ?? null;
    this.int1 = fields.int1 ?? 0;
    this.int2 = fields.int2 ?? 0;
  }

  static decode(body: Buffer): LibvirtError {
    const r = new XdrReader(body);
    const code = r.int();
    const domain = r.int();
    const message = r.optional((x) => x.string());
    const level = r.int();
    r.optional((x) => {
      x.string();
      x.fixedOpaque(16);
      return x.int();
    });
    const str1 = r.optional((x) => x.string());
    const str2 = r.optional((x) => x.string());
    const str3 = r.optional((x) => x.string());
    const int1 = r.int();
    const int2 = r.int();
    // `net` (unused by the daemon) may follow; ignore the rest.
    return new LibvirtError({ code, domain, message, level, str1, str2, str3, int1, int2 });
  }

  encode(): Buffer {
    const w = new XdrWriter();
    w.int(this.code).int(this.domain);
    w.optional(this.message, (x, s) => x.string(s));
    w.int(this.level);
    w.bool(false);
    w.optional(this.str1, (x, s) => x.string(s));
    w.optional(this.str2, (x, s) => x.string(s));
    w.optional(this.str3, (x, s) => x.string(s));
    w.int(this.int1).int(this.int2);
    w.bool(false);
    return w.bytes();
  }
}

/** The connection is closed or dead: every pending and later call fails with this. */
export class RpcConnectionError extends Error {
  constructor(message: string, opts?: { cause?: unknown }) {
    super(message, opts);
    this.name = 'RpcConnectionError';
  }
}

/** The peer sent something this client cannot make sense of; the connection is closed. */
export class RpcProtocolError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'RpcProtocolError';
  }
}

export interface KeepaliveOptions {
  /** Send a PING after this long without hearing anything. libvirt's default is 5 s. */
  intervalMs: number;
  /** Declare the connection dead after this many unanswered PINGs. libvirt's default is 5. */
  count: number;
}

export interface RpcClientOptions {
  logger?: Logger;
  clock?: Clock;
  /** false disables our PINGs (we still answer the daemon's). */
  keepalive?: KeepaliveOptions | false;
  /** Free text for log lines, e.g. the host name. */
  label?: string;
}

export interface CallOptions {
  signal?: AbortSignal | undefined;
  program?: number;
  version?: number;
}

export interface RpcStats {
  callsSent: number;
  pingsReceived: number;
  pongsSent: number;
  pingsSent: number;
  pongsReceived: number;
  lateRepliesDiscarded: number;
}

interface PendingCall {
  proc: number;
  resolve: (body: Buffer) => void;
  reject: (err: Error) => void;
}

type StreamHandler = (p: Packet) => void;

const abortReason = (signal: AbortSignal): Error =>
  signal.reason instanceof Error
    ? signal.reason
    : new DOMException('The operation was aborted', 'AbortError');

/** How many abandoned serials we remember, so their late replies are recognised and dropped quietly. */
const ABANDONED_MEMORY = 4096;

export class RpcClient {
  private readonly stream: Duplex;
  /** The connection's logger (host label included); LibvirtConnection traces its calls on it. */
  readonly log: Logger;
  readonly clock: Clock;
  private readonly keepalive: KeepaliveOptions | false;
  private readonly decoder = new PacketDecoder();
  private readonly pending = new Map<number, PendingCall>();
  private readonly streams = new Map<number, StreamHandler>();
  private readonly abandoned = new Set<number>();
  private readonly closeListeners = new Set<(err: Error | undefined) => void>();
  private nextSerial = 1;
  private closedWith: Error | undefined | null = null; // null = open
  private lastReceived: number;
  private unansweredPings = 0;
  private keepaliveTimer: TimerHandle | undefined;
  readonly stats: RpcStats = {
    callsSent: 0,
    pingsReceived: 0,
    pongsSent: 0,
    pingsSent: 0,
    pongsReceived: 0,
    lateRepliesDiscarded: 0,
  };

  constructor(stream: Duplex, opts: RpcClientOptions = {}) {
    this.stream = stream;
    this.clock = opts.clock ?? systemClock;
    this.keepalive = opts.keepalive ?? { intervalMs: 5000, count: 5 };
    this.log = (opts.logger ?? silentLogger()).child({
      component: 'libvirt-rpc',
      ...(opts.label ? { host: opts.label } : {}),
    });
    this.lastReceived = this.clock.now();
    stream.on('data', (chunk: Buffer) => this.onData(chunk));
    stream.on('error', (err: Error) =>
      this.fail(new RpcConnectionError(`libvirt connection error: ${err.message}`, { cause: err })),
    );
    stream.on('end', () => this.fail(new RpcConnectionError('libvirt connection closed by peer')));
    stream.on('close', () => this.fail(new RpcConnectionError('libvirt connection closed')));
    if (this.keepalive) this.scheduleKeepalive();
  }

  /** True until the connection is closed, fails, or is declared dead by keepalive. */
  get isOpen(): boolean {
    return this.closedWith === null;
  }

  /** Calls `fn` once when the connection goes away (with the reason; undefined for close()). */
  onClose(fn: (err: Error | undefined) => void): () => void {
    if (this.closedWith !== null) {
      queueMicrotask(() => fn(this.closedWith ?? undefined));
      return () => {};
    }
    this.closeListeners.add(fn);
    return () => this.closeListeners.delete(fn);
  }

  /**
   * One remote call: resolves with the reply body (XDR `*_ret`), rejects with LibvirtError for
   * an error reply. Aborting only stops waiting: the connection stays usable and the late reply
   * is discarded when it arrives.
   */
  call(proc: number, args?: Uint8Array, opts: CallOptions = {}): Promise<Buffer> {
    return this.startCall(proc, args, opts).reply;
  }

  private startCall(
    proc: number,
    args: Uint8Array | undefined,
    opts: CallOptions,
  ): { serial: number; reply: Promise<Buffer> } {
    const serial = this.allocSerial();
    const reply = new Promise<Buffer>((resolve, reject) => {
      if (this.closedWith !== null) {
        reject(this.closedError());
        return;
      }
      const { signal } = opts;
      if (signal?.aborted) {
        reject(abortReason(signal));
        return;
      }
      const onAbort = () => {
        if (!this.pending.delete(serial)) return;
        this.remember(serial);
        reject(abortReason(signal!));
      };
      signal?.addEventListener('abort', onAbort, { once: true });
      const cleanup = () => signal?.removeEventListener('abort', onAbort);
      this.pending.set(serial, {
        proc,
        resolve: (b) => {
          cleanup();
          resolve(b);
        },
        reject: (e) => {
          cleanup();
          reject(e);
        },
      });
      this.stats.callsSent++;
      this.write(
        {
          prog: opts.program ?? REMOTE_PROGRAM,
          vers: opts.version ?? REMOTE_PROTOCOL_VERSION,
          proc,
          type: MessageType.Call,
          serial,
          status: MessageStatus.Ok,
        },
        args,
      );
    });
    return { serial, reply };
  }

  /**
   * A call that opens an upload stream (e.g. STORAGE_VOL_UPLOAD): sends the call, then `data`
   * as stream packets, then the finish packet, and resolves when libvirtd confirms the finish.
   * Abort sends a stream abort; the connection stays usable.
   */
  async upload(
    proc: number,
    args: Uint8Array,
    data: Uint8Array | AsyncIterable<Uint8Array> | Iterable<Uint8Array>,
    opts: CallOptions = {},
  ): Promise<void> {
    const { signal } = opts;
    let streamError: Error | undefined;
    let finishResolve: () => void = () => {};
    let finishReject: (e: Error) => void = () => {};
    const finished = new Promise<void>((res, rej) => {
      finishResolve = res;
      finishReject = rej;
    });
    finished.catch(() => {});
    // The call itself is not tied to the signal: if the caller gives up before libvirtd has
    // opened the stream, the stream is aborted once the (late) reply says it exists.
    const { serial, reply } = this.startCall(proc, args, { ...opts, signal: undefined });
    const base = {
      prog: opts.program ?? REMOTE_PROGRAM,
      vers: opts.version ?? REMOTE_PROTOCOL_VERSION,
      proc,
      type: MessageType.Stream,
      serial,
    };
    // Stream packets from the daemon: an error at any time, or the ack of our finish.
    this.streams.set(serial, (p) => {
      if (p.header.status === MessageStatus.Error) {
        streamError = safeDecodeError(p.body);
        finishReject(streamError);
      } else if (p.header.status === MessageStatus.Ok) {
        finishResolve();
      }
    });
    const onClose = this.onClose((err) => finishReject(err ?? this.closedError()));
    let opened = false;
    try {
      await this.awaitStreamOpen(reply, serial, base, signal);
      opened = true;
      for await (const chunk of iterate(data)) {
        for (let off = 0; off < chunk.length; off += STREAM_CHUNK_SIZE) {
          if (signal?.aborted) throw abortReason(signal);
          if (streamError) throw streamError;
          if (this.closedWith !== null) throw this.closedError();
          const piece = chunk.subarray(off, Math.min(chunk.length, off + STREAM_CHUNK_SIZE));
          if (!this.write({ ...base, status: MessageStatus.Continue }, piece)) {
            // A stream error from the daemon must not leave us waiting for a drain.
            await Promise.race([this.drained(signal), finished.catch(() => {})]);
          }
        }
      }
      if (signal?.aborted) throw abortReason(signal);
      if (streamError) throw streamError;
      this.write({ ...base, status: MessageStatus.Ok });
      await raceAbort(finished, signal);
    } catch (err) {
      // Tell the daemon to drop the stream (unless it never opened or failed it itself).
      if (opened && !streamError && this.closedWith === null) {
        this.write({ ...base, status: MessageStatus.Error });
        this.remember(serial);
      }
      throw err;
    } finally {
      this.streams.delete(serial);
      onClose();
    }
  }

  /**
   * A call that opens a download stream (e.g. STORAGE_VOL_DOWNLOAD): yields the data packets as
   * they arrive, then sends the finish packet and waits for its ack.
   */
  async *download(proc: number, args: Uint8Array, opts: CallOptions = {}): AsyncGenerator<Buffer> {
    const { signal } = opts;
    const queue: Packet[] = [];
    let wake: (() => void) | undefined;
    // The call itself is not tied to the signal: if the caller gives up before libvirtd has
    // opened the stream, the stream is aborted once the (late) reply says it exists.
    const { serial, reply } = this.startCall(proc, args, { ...opts, signal: undefined });
    this.streams.set(serial, (p) => {
      queue.push(p);
      wake?.();
    });
    let closeErr: Error | undefined;
    const onClose = this.onClose((err) => {
      closeErr = err ?? this.closedError();
      wake?.();
    });
    const base = {
      prog: opts.program ?? REMOTE_PROGRAM,
      vers: opts.version ?? REMOTE_PROTOCOL_VERSION,
      proc,
      type: MessageType.Stream,
      serial,
    };
    const next = async (): Promise<Packet> => {
      while (queue.length === 0) {
        if (closeErr) throw closeErr;
        if (signal?.aborted) throw abortReason(signal);
        await raceAbort(
          new Promise<void>((r) => {
            wake = r;
          }),
          signal,
        );
        wake = undefined;
      }
      return queue.shift()!;
    };
    let done = false;
    try {
      try {
        await this.awaitStreamOpen(reply, serial, base, signal);
      } catch (err) {
        done = true; // no stream is open yet (a late open is aborted by awaitStreamOpen)
        throw err;
      }
      for (;;) {
        const p = await next();
        if (p.header.status === MessageStatus.Error) {
          done = true;
          throw safeDecodeError(p.body);
        }
        if (p.header.status === MessageStatus.Continue && p.body.length > 0) {
          yield p.body;
          continue;
        }
        if (p.header.status === MessageStatus.Ok) {
          done = true;
          return;
        }
        // An empty data packet is end-of-file: send our finish and wait for the daemon's ack.
        this.write({ ...base, status: MessageStatus.Ok });
        const ack = await next();
        done = true;
        if (ack.header.status === MessageStatus.Error) throw safeDecodeError(ack.body);
        return;
      }
    } finally {
      if (!done && this.closedWith === null) {
        this.write({ ...base, status: MessageStatus.Error });
        this.remember(serial);
      }
      this.streams.delete(serial);
      onClose();
    }
  }

  private async awaitStreamOpen(
    reply: Promise<Buffer>,
    serial: number,
    base: Omit<Header, 'status'>,
    signal: AbortSignal | undefined,
  ): Promise<void> {
    try {
      await raceAbort(reply, signal);
    } catch (err) {
      if (signal?.aborted) {
        this.remember(serial);
        reply.then(
          () => this.write({ ...base, status: MessageStatus.Error }),
          () => {},
        );
      }
      throw err;
    }
  }

  /** Closes the transport; pending calls fail with RpcConnectionError. Idempotent. */
  close(): void {
    if (this.closedWith !== null) return;
    this.fail(undefined);
  }

  private closedError(): Error {
    const reason = this.closedWith;
    if (reason instanceof RpcConnectionError) return reason;
    return new RpcConnectionError(
      reason ? `libvirt connection closed: ${reason.message}` : 'libvirt connection closed',
      {
        cause: reason ?? undefined,
      },
    );
  }

  private fail(err: Error | undefined): void {
    if (this.closedWith !== null) return;
    this.closedWith = err;
    if (this.keepaliveTimer) this.clock.clearTimeout(this.keepaliveTimer);
    this.keepaliveTimer = undefined;
    const closedErr = this.closedError();
    if (err) this.log.debug({ err, pending: this.pending.size }, 'libvirt connection lost');
    const calls = [...this.pending.values()];
    this.pending.clear();
    for (const c of calls) c.reject(closedErr);
    this.stream.destroy();
    const listeners = [...this.closeListeners];
    this.closeListeners.clear();
    for (const fn of listeners) fn(err);
  }

  private allocSerial(): number {
    const s = this.nextSerial;
    this.nextSerial = this.nextSerial >= 0xffff_ffff ? 1 : this.nextSerial + 1;
    return s;
  }

  private remember(serial: number): void {
    this.abandoned.add(serial);
    if (this.abandoned.size > ABANDONED_MEMORY) {
      const oldest = this.abandoned.values().next().value;
      if (oldest !== undefined) this.abandoned.delete(oldest);
    }
  }

  private write(h: Header, body?: Uint8Array): boolean {
    if (this.closedWith !== null) return false;
    return this.stream.write(encodePacket(h, body));
  }

  private drained(signal: AbortSignal | undefined): Promise<void> {
    return raceAbort(
      new Promise<void>((resolve) => {
        const done = () => {
          this.stream.off('drain', done);
          off();
          resolve();
        };
        const off = this.onClose(done);
        this.stream.once('drain', done);
      }),
      signal,
    );
  }

  private onData(chunk: Buffer): void {
    if (this.closedWith !== null) return;
    let packets: Packet[];
    try {
      packets = this.decoder.push(chunk);
    } catch (err) {
      this.fail(err instanceof Error ? err : new RpcProtocolError(String(err)));
      return;
    }
    this.lastReceived = this.clock.now();
    this.unansweredPings = 0;
    for (const p of packets) {
      try {
        this.dispatch(p);
      } catch (err) {
        this.fail(new RpcProtocolError(`bad packet for proc ${p.header.proc}: ${(err as Error).message}`));
        return;
      }
    }
  }

  private dispatch(p: Packet): void {
    const h = p.header;
    if (h.prog === KEEPALIVE_PROGRAM) {
      if (h.proc === KEEPALIVE_PROC_PING) {
        this.stats.pingsReceived++;
        this.stats.pongsSent++;
        this.write({
          prog: KEEPALIVE_PROGRAM,
          vers: KEEPALIVE_PROTOCOL_VERSION,
          proc: KEEPALIVE_PROC_PONG,
          type: MessageType.Message,
          serial: 0,
          status: MessageStatus.Ok,
        });
      } else if (h.proc === KEEPALIVE_PROC_PONG) {
        this.stats.pongsReceived++;
      }
      return;
    }
    if (h.type === MessageType.Reply || h.type === MessageType.ReplyWithFds) {
      const call = this.pending.get(h.serial);
      if (!call) {
        this.noteStray(h);
        return;
      }
      this.pending.delete(h.serial);
      if (h.status === MessageStatus.Ok) call.resolve(p.body);
      else call.reject(safeDecodeError(p.body));
      return;
    }
    if (h.type === MessageType.Stream) {
      const handler = this.streams.get(h.serial);
      if (handler) handler(p);
      else this.noteStray(h);
      return;
    }
    // VIR_NET_MESSAGE from the remote program are events; we register for none.
    this.log.debug({ prog: h.prog, proc: h.proc, type: h.type }, 'ignoring unsolicited libvirt message');
  }

  private noteStray(h: Header): void {
    if (this.abandoned.has(h.serial)) {
      if (h.type === MessageType.Reply) this.abandoned.delete(h.serial);
      this.stats.lateRepliesDiscarded++;
      return;
    }
    this.log.debug({ serial: h.serial, proc: h.proc, type: h.type }, 'discarding packet for unknown serial');
  }

  private scheduleKeepalive(): void {
    const ka = this.keepalive;
    if (!ka || this.closedWith !== null) return;
    this.keepaliveTimer = this.clock.setTimeout(() => this.keepaliveTick(ka), ka.intervalMs);
  }

  private keepaliveTick(ka: KeepaliveOptions): void {
    if (this.closedWith !== null) return;
    if (this.clock.now() - this.lastReceived >= ka.intervalMs) {
      if (this.unansweredPings >= ka.count) {
        this.log.warn({ pings: this.unansweredPings }, 'libvirt connection dead: no answer to keepalive');
        this.fail(
          new RpcConnectionError(
            `libvirt connection dead: no data for ${this.clock.now() - this.lastReceived} ms after ${this.unansweredPings} keepalive pings`,
          ),
        );
        return;
      }
      this.unansweredPings++;
      this.stats.pingsSent++;
      this.write({
        prog: KEEPALIVE_PROGRAM,
        vers: KEEPALIVE_PROTOCOL_VERSION,
        proc: KEEPALIVE_PROC_PING,
        type: MessageType.Message,
        serial: 0,
        status: MessageStatus.Ok,
      });
    }
    this.scheduleKeepalive();
  }
}

function safeDecodeError(body: Buffer): LibvirtError {
  try {
    return LibvirtError.decode(body);
  } catch {
    return new LibvirtError({ code: 39, domain: 0, message: 'undecodable libvirt error reply', level: 2 });
  }
}

async function* iterate(
  data: Uint8Array | AsyncIterable<Uint8Array> | Iterable<Uint8Array>,
): AsyncGenerator<Uint8Array> {
  if (data instanceof Uint8Array) {
    yield data;
    return;
  }
  for await (const chunk of data) yield chunk;
}

function raceAbort<T>(p: Promise<T>, signal: AbortSignal | undefined): Promise<T> {
  if (!signal) return p;
  if (signal.aborted) return Promise.reject(abortReason(signal));
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(abortReason(signal));
    signal.addEventListener('abort', onAbort, { once: true });
    p.then(
      (v) => {
        signal.removeEventListener('abort', onAbort);
        resolve(v);
      },
      (e) => {
        signal.removeEventListener('abort', onAbort);
        reject(e);
      },
    );
  });
}
