/**
 * gateway/http1 — the gateway's one HTTP/1.1 client, for both ways a request leaves: in absolute
 * form to an upstream, and in origin form over TLS through an upstream's tunnel (gateway/forward,
 * gateway/inspect). Connections are kept alive in a pool per destination; the answer's head is
 * read by hand and its body handed on as the bytes that arrive: a Content-Length body is the
 * socket's own reads, untouched, a chunked one their data slices. Relaying a large answer so
 * costs no parser copy and two stream layers fewer than Node's HTTP client (docs/benchmarks.md,
 * "Inspected HTTPS").
 *
 * Heads and framing are read by gateway/http1-wire; interim 1xx answers are skipped; a head
 * that is malformed, too long, or carries what Node would refuse to send on is an error the
 * caller turns into 502: nothing unchecked reaches a client.
 */
import { EventEmitter } from 'node:events';
import type http from 'node:http';
import type net from 'node:net';
import { Writable } from 'node:stream';
import {
  type AnswerHead,
  ChunkedReader,
  type Framing,
  MAX_HEAD_BYTES,
  parseAnswerHead,
} from './http1-wire.ts';

const HEAD_END = Buffer.from('\r\n\r\n');

/** The far side broke the protocol or the connection: the caller answers 502. */
export class AnswerError extends Error {
  readonly code: string;
  constructor(code: string, message: string) {
    super(message);
    this.name = 'AnswerError';
    this.code = code;
  }
}

/** Idle keep-alive connections per destination key. */
export class ConnectionPool {
  private readonly free = new Map<string, Set<net.Socket>>();
  private readonly maxFree: number;
  private readonly idleMs: number;

  constructor(opts: { maxFree: number; idleMs: number }) {
    this.maxFree = opts.maxFree;
    this.idleMs = opts.idleMs;
  }

  /** An idle connection to `key`, taken out of the pool, or undefined. */
  take(key: string): net.Socket | undefined {
    const set = this.free.get(key);
    if (!set) return undefined;
    for (const s of set) {
      this.forget(key, s);
      if (!s.destroyed && s.readable && s.writable) return s;
      s.destroy();
    }
    return undefined;
  }

  /** Keeps a connection whose exchange ended cleanly, until it idles out or the far side closes it. */
  give(key: string, s: net.Socket): void {
    const set = this.free.get(key) ?? new Set<net.Socket>();
    if (set.size >= this.maxFree || s.destroyed) {
      s.destroy();
      return;
    }
    set.add(s);
    this.free.set(key, set);
    const drop = () => {
      this.forget(key, s);
      s.destroy();
    };
    // Anything the far side says on an idle connection (data, close, an error) ends it.
    s.once('data', drop);
    s.once('end', drop);
    s.once('close', drop);
    s.once('error', drop);
    s.once('timeout', drop);
    s.setTimeout(this.idleMs);
    (s as Pooled)[DROP] = drop;
    s.resume();
  }

  private forget(key: string, s: net.Socket): void {
    const drop = (s as Pooled)[DROP];
    if (drop) {
      for (const event of ['data', 'end', 'close', 'error', 'timeout']) s.off(event, drop);
      s.setTimeout(0);
      delete (s as Pooled)[DROP];
    }
    s.pause();
    const set = this.free.get(key);
    set?.delete(s);
    if (set?.size === 0) this.free.delete(key);
  }

  /** Ends every idle connection. */
  close(): void {
    for (const set of this.free.values()) for (const s of set) s.destroy();
    this.free.clear();
  }
}
const DROP = Symbol('drop');
/** A pooled connection remembers the listener that drops it, to take it off when it is reused. */
type Pooled = net.Socket & { [DROP]?: () => void };

/**
 * An answer's body as it arrives: 'data' (Buffer), then 'end', or 'error' when the far side
 * broke off. Starts paused: nothing flows until `resume()`.
 */
export class Answer extends EventEmitter implements AnswerHead {
  readonly statusCode: number;
  readonly statusMessage: string;
  readonly keepAlive: boolean;
  readonly rawHeaders: string[];
  readonly headers: http.IncomingHttpHeaders;
  readonly framing: Framing;
  private paused = true;
  /** Ended, failed or destroyed: nothing more is emitted. */
  private ended = false;
  private readonly queue: Buffer[] = [];
  private left: number;
  private readonly chunks: ChunkedReader | undefined;
  private readonly io: AnswerIo;
  /**
   * A `101 Switching Protocols` to a request that asked to upgrade: the connection, now the new
   * protocol's, and what the far side sent after the head. The answer has no body.
   */
  readonly upgraded: { socket: net.Socket; rest: Buffer } | undefined;

  constructor(head: AnswerHead, io: AnswerIo, upgraded?: { socket: net.Socket; rest: Buffer }) {
    super();
    this.statusCode = head.statusCode;
    this.statusMessage = head.statusMessage;
    this.keepAlive = head.keepAlive;
    this.rawHeaders = head.rawHeaders;
    this.headers = head.headers;
    this.framing = head.framing;
    this.left = head.framing.kind === 'length' ? head.framing.bytes : 0;
    this.chunks = head.framing.kind === 'chunked' ? new ChunkedReader() : undefined;
    this.io = io;
    this.upgraded = upgraded;
  }

  pause(): this {
    this.paused = true;
    this.io.pause();
    return this;
  }

  resume(): this {
    if (!this.paused || this.ended) return this;
    this.paused = false;
    while (!this.paused && !this.ended && this.queue.length > 0) this.take(this.queue.shift() as Buffer);
    if (this.paused || this.ended) return this;
    if (this.framing.kind === 'none' || (this.framing.kind === 'length' && this.left === 0))
      this.finish(true);
    else if (this.eof) this.closed(this.eof === 'end' ? undefined : this.eof);
    else this.io.resume();
    return this;
  }

  /** Drops the answer and its connection. */
  destroy(): this {
    this.upgraded?.socket.destroy();
    if (this.ended) return this;
    this.ended = true;
    this.queue.length = 0;
    this.io.release(false);
    return this;
  }

  /** Bytes from the connection. */
  take(buf: Buffer): void {
    if (this.ended) return;
    if (this.paused) {
      this.queue.push(buf);
      this.io.pause();
      return;
    }
    switch (this.framing.kind) {
      case 'none':
        this.finish(false);
        return;
      case 'close':
        this.emit('data', buf);
        return;
      case 'length': {
        const n = Math.min(this.left, buf.length);
        this.left -= n;
        this.emit('data', n === buf.length ? buf : buf.subarray(0, n));
        // Bytes past the announced length: the far side broke framing, so its connection goes.
        if (this.left === 0) this.finish(n === buf.length);
        return;
      }
      case 'chunked': {
        const reader = this.chunks as ChunkedReader;
        const used = reader.feed(buf, (slice) => {
          this.emit('data', slice);
          return !this.paused && !this.ended;
        });
        if (typeof used === 'string') {
          this.fail(new AnswerError('EPROTO', used));
          return;
        }
        if (reader.done) {
          this.finish(used === buf.length);
          return;
        }
        if (used < buf.length && !this.ended) this.queue.unshift(buf.subarray(used));
        return;
      }
    }
  }

  /**
   * The connection ended (`err` when it broke): the end of a close-delimited body, otherwise a
   * cut one. A paused reader first gets what is queued.
   */
  closed(err?: Error): void {
    if (this.ended) return;
    if (this.paused) {
      // Told when it resumes, after what is queued: nobody may be listening yet.
      this.eof ??= err ?? 'end';
      return;
    }
    if (!err && this.framing.kind === 'close') {
      this.finish(false);
      return;
    }
    this.fail(err ?? new AnswerError('ECONNRESET', 'the far side closed in the middle of the answer'));
  }

  private eof: Error | 'end' | undefined;

  private finish(reusable: boolean): void {
    if (this.ended) return;
    this.ended = true;
    this.io.release(reusable && this.keepAlive);
    this.emit('end');
  }

  private fail(err: Error): void {
    if (this.ended) return;
    this.ended = true;
    this.io.release(false);
    this.emit('error', err);
  }
}

/** What an answer needs of its connection. */
interface AnswerIo {
  pause(): void;
  resume(): void;
  /** The answer is done with the connection: back to the pool when `reusable`, else destroyed. */
  release(reusable: boolean): void;
}

/** An upgraded answer's connection is its own: the answer has nothing to pause or give back. */
const UPGRADED_IO: AnswerIo = { pause: () => undefined, resume: () => undefined, release: () => undefined };

/** One request as the gateway sends it. */
export interface RequestSpec {
  method: string;
  /** The request target as written on the request line (origin form or absolute form). */
  target: string;
  /**
   * Headers to send, Host included; a body without Content-Length is sent chunked. With an
   * `Upgrade` header the request may be answered `101`: the connection is then the answer's
   * (`Answer.upgraded`), never pooled again.
   */
  headers: [string, string][];
  pool: ConnectionPool;
  /** Pool key: connections are reused only for the same destination. */
  key: string;
  /** Opens a new connection (rejects with the error the caller reports). */
  connect: () => Promise<net.Socket>;
  /** A connection that says nothing for this long is cut. */
  idleMs: number;
}

/**
 * A request on its way: a Writable for its body (end() with no writes sends none) that emits
 * 'response' with the `Answer` once a final head arrived, or 'error' before that.
 */
export class OutgoingRequest extends Writable {
  private readonly spec: RequestSpec;
  private readonly sizedBody: boolean;
  /** The request asks to switch protocols: a 101 answer is taken, not refused. */
  private readonly upgrade: boolean;
  /** The connection while this request has it. */
  private socket: net.Socket | undefined;
  private ready: Promise<net.Socket | undefined>;
  /** Whether the connection came from the pool (it may have been closed under us). */
  private reused = false;
  private headSent = false;
  private wroteBody = false;
  private bodySent = false;
  private answer: Answer | undefined;
  /** The answer ended cleanly before the body was all sent: the connection is kept once it is. */
  private keepWhenSent = false;
  private head: Buffer = Buffer.alloc(0);

  constructor(spec: RequestSpec) {
    // Not destroyed once the body is sent: the answer is still to come on its connection.
    super({ autoDestroy: false });
    this.spec = spec;
    this.sizedBody = spec.headers.some(([k]) => k.toLowerCase() === 'content-length');
    this.upgrade = spec.headers.some(([k]) => k.toLowerCase() === 'upgrade');
    const pooled = spec.pool.take(spec.key);
    if (pooled) {
      this.reused = true;
      this.attach(pooled);
      this.ready = Promise.resolve(pooled);
    } else this.ready = this.dial();
  }

  private dial(): Promise<net.Socket | undefined> {
    return this.spec.connect().then(
      (s) => {
        if (this.destroyed) {
          s.destroy();
          return undefined;
        }
        this.attach(s);
        return s;
      },
      (err: Error) => {
        this.abort(err);
        return undefined;
      },
    );
  }

  private attach(s: net.Socket): void {
    this.socket = s;
    s.on('data', this.onData);
    s.on('end', this.onEnd);
    s.on('close', this.onEnd);
    s.on('error', this.onError);
    s.on('timeout', this.onTimeout);
    s.setTimeout(this.spec.idleMs);
    s.resume();
  }

  /** Takes the connection back from this request: to the pool when `keep`, else destroyed. */
  private letGo(keep: boolean): void {
    const s = this.detach();
    if (!s) return;
    if (keep && s.readableLength === 0) this.spec.pool.give(this.spec.key, s);
    else s.destroy();
  }

  /** The connection, no longer this request's (nothing of this request listens to it). */
  private detach(): net.Socket | undefined {
    const s = this.socket;
    if (!s) return undefined;
    this.socket = undefined;
    s.off('data', this.onData);
    s.off('end', this.onEnd);
    s.off('close', this.onEnd);
    s.off('error', this.onError);
    s.off('timeout', this.onTimeout);
    s.setTimeout(0);
    return s;
  }

  private requestHead(chunked: boolean): string {
    let text = `${this.spec.method} ${this.spec.target} HTTP/1.1\r\n`;
    for (const [k, v] of this.spec.headers) text += `${k}: ${v}\r\n`;
    if (chunked) text += 'Transfer-Encoding: chunked\r\n';
    return `${text}\r\n`;
  }

  override _write(chunk: Buffer, _enc: BufferEncoding, callback: (err?: Error | null) => void): void {
    void this.ready.then((s) => {
      if (!s || this.destroyed || chunk.length === 0) return callback();
      this.wroteBody = true;
      const chunked = !this.sizedBody;
      if (!this.headSent) {
        this.headSent = true;
        s.write(this.requestHead(chunked));
      }
      if (chunked) s.write(`${chunk.length.toString(16)}\r\n`);
      let more = s.write(chunk);
      if (chunked) more = s.write('\r\n');
      if (more) callback();
      else s.once('drain', () => callback());
    });
  }

  override _final(callback: (err?: Error | null) => void): void {
    void this.ready.then((s) => {
      if (!s || this.destroyed) return callback();
      if (!this.headSent) {
        this.headSent = true;
        const head = this.requestHead(false);
        this.head = Buffer.from(head, 'latin1');
        s.write(head);
      } else if (this.wroteBody && !this.sizedBody) s.write('0\r\n\r\n');
      this.bodySent = true;
      if (this.keepWhenSent) this.letGo(true);
      callback();
    });
  }

  /** Abandons the request and its connection. */
  override _destroy(err: Error | null, callback: (err?: Error | null) => void): void {
    this.answer?.destroy();
    this.letGo(false);
    callback(err);
  }

  /** Fails the request before an answer: 'error', then destroyed. */
  private abort(err: Error): void {
    if (this.destroyed || this.answer) return;
    this.emit('error', err);
    this.destroy();
  }

  private pending: Buffer = Buffer.alloc(0);

  private readonly onData = (chunk: Buffer): void => {
    if (this.answer) {
      this.answer.take(chunk);
      return;
    }
    this.pending = this.pending.length === 0 ? chunk : Buffer.concat([this.pending, chunk]);
    for (;;) {
      const end = this.pending.indexOf(HEAD_END);
      if (end < 0) {
        if (this.pending.length > MAX_HEAD_BYTES) this.broken('EPROTO', 'answer head too long');
        return;
      }
      const head = parseAnswerHead(this.pending, end, this.spec.method);
      if (typeof head === 'string') {
        this.broken('EPROTO', head);
        return;
      }
      const rest = this.pending.subarray(end + 4);
      this.pending = Buffer.alloc(0);
      if (head.statusCode === 101) {
        const socket = this.upgrade && this.bodySent ? this.detach() : undefined;
        if (!socket) {
          this.broken('EPROTO', 'a protocol switch the request did not ask for');
          return;
        }
        socket.pause();
        this.answer = new Answer(head, UPGRADED_IO, { socket, rest });
        this.emit('response', this.answer);
        return;
      }
      if (head.statusCode < 200) {
        // An interim answer (100 Continue, 103 Early Hints): the final one follows.
        this.pending = rest;
        continue;
      }
      const answer = new Answer(head, this.answerIo);
      this.answer = answer;
      this.socket?.pause();
      this.emit('response', answer);
      if (rest.length > 0) answer.take(rest);
      return;
    }
  };

  private readonly answerIo: AnswerIo = {
    pause: () => this.socket?.pause(),
    resume: () => this.socket?.resume(),
    release: (reusable) => {
      // An answer may end before the request's body was all sent (an early refusal): the
      // connection is kept only once both sides are done with it.
      if (reusable && !this.bodySent && !this.destroyed) this.keepWhenSent = true;
      else this.letGo(reusable && !this.destroyed);
    },
  };

  /** The far side broke the protocol: the answer fails, or the request does. */
  private broken(code: string, message: string): void {
    const err = new AnswerError(code, message);
    this.letGo(false);
    if (this.answer) this.answer.closed(err);
    else this.abort(err);
  }

  private readonly onEnd = (): void => {
    if (this.answer) {
      this.answer.closed();
      return;
    }
    this.lost();
  };

  private readonly onError = (err: Error): void => {
    if (this.answer) {
      this.answer.closed(err);
      return;
    }
    this.lost(err);
  };

  private readonly onTimeout = (): void => this.broken('ETIMEDOUT', 'the far side went quiet');

  /**
   * The connection ended before any answer. A pooled one the far side had already given up on
   * is replaced by a new connection, once, when no body went out yet: that is the race of
   * reusing idle connections, not the far side failing.
   */
  private lost(err?: Error): void {
    this.letGo(false);
    if (this.destroyed || this.answer) return;
    if (this.reused && !this.wroteBody && this.pending.length === 0) {
      this.reused = false;
      const resend = this.headSent ? this.head : undefined;
      this.ready = this.dial().then((s) => {
        if (s && resend) s.write(resend);
        return s;
      });
      return;
    }
    this.abort(err ?? new AnswerError('ECONNRESET', 'the far side closed before answering'));
  }
}

/** Sends a request; write its body (if any) and end() it. */
export function request(spec: RequestSpec): OutgoingRequest {
  return new OutgoingRequest(spec);
}
