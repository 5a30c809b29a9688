/**
 * gateway/dial — opens a CONNECT tunnel through one upstream proxy on a raw socket: one write
 * of the CONNECT request, the reply head read by hand, and the socket handed back untouched,
 * so a tunnel costs one round trip to the upstream and no HTTP machinery on the data path
 * (docs/gateway.md, "Why not proxy-chain"). The upstream socket reads into a buffer of its own
 * (`onread`) that is written straight to the client once the tunnel is up (`pipeTo`): no buffer
 * allocated per read unless the client is still holding the last one.
 */
import net from 'node:net';
import type { Upstream } from './upstreams.ts';

/** A reply head longer than this is not a proxy's CONNECT answer. */
const MAX_HEAD_BYTES = 16 * 1024;
/** Bytes per read from an upstream (untouched pages of an idle tunnel's buffer cost no memory). */
const READ_BYTES = 256 * 1024;

/** Where an upstream socket's reads go once its tunnel is up. */
export interface UpstreamReader {
  /** Copies everything read from now on to `client`, pausing while the client cannot take more. */
  pipeTo(client: net.Socket): void;
}

export type DialOutcome =
  | { ok: true; socket: net.Socket; rest: Buffer; reader: UpstreamReader }
  /** The upstream itself failed (refused, reset, timed out, or refused our credentials with 407). */
  | { ok: false; kind: 'failed'; why: string }
  /** The upstream answered but would not open the tunnel (403 by its egress policy, 502 for a dead origin…). */
  | { ok: false; kind: 'answered'; status: number; reason: string };

/** `CONNECT authority` through `up`, giving up after `timeoutMs` (connect plus reply). */
export function dialTunnel(up: Upstream, authority: string, timeoutMs: number): Promise<DialOutcome> {
  return new Promise((resolve) => {
    let buf = Buffer.allocUnsafe(READ_BYTES);
    /** The last read's bytes are still queued for the client: the next read needs another buffer. */
    let handedOff = false;
    let client: net.Socket | undefined;
    let onHead: ((chunk: Buffer) => boolean) | undefined;
    const socket = net.connect({
      host: up.host,
      port: up.port,
      noDelay: true,
      onread: {
        buffer: () => {
          if (handedOff) {
            buf = Buffer.allocUnsafe(READ_BYTES);
            handedOff = false;
          }
          return buf;
        },
        callback: (n: number, b: Uint8Array) => {
          const chunk = (b as Buffer).subarray(0, n);
          if (!client) return onHead ? onHead(chunk) : false;
          const more = client.write(chunk);
          // Written through to the kernel, the buffer is free again; otherwise it is the client's now.
          if (client.writableLength > 0) handedOff = true;
          if (more) return true;
          client.once('drain', () => socket.resume());
          return false;
        },
      },
    });
    const reader: UpstreamReader = {
      pipeTo: (c) => {
        client = c;
        socket.once('end', () => c.end());
        socket.resume();
      },
    };
    let head: Buffer = Buffer.alloc(0);
    const finish = dialEnd<DialOutcome>(up, authority, socket, timeoutMs, (o) => {
      onHead = undefined;
      resolve(o);
    });
    /** Reads of the reply head (copied: the read buffer is reused); false stops reading. */
    onHead = (chunk: Buffer) => {
      head = Buffer.concat([head, chunk]);
      const end = head.indexOf('\r\n\r\n');
      if (end < 0) {
        if (head.length <= MAX_HEAD_BYTES) return true;
        finish({ ok: false, kind: 'failed', why: 'reply head too long' });
        return false;
      }
      const refused = refusal(head, end);
      finish(refused ?? { ok: true, socket, rest: head.subarray(end + 4), reader });
      // Nothing more is read until the tunnel is piped (or the socket is destroyed).
      return false;
    };
    // Flowing from the start: with `onread` the callback gets the bytes, and 'end' is emitted.
    socket.resume();
  });
}

/**
 * The one way a dial ends: sends the CONNECT once connected, and returns `finish`, which settles
 * once (the deadline cleared, the socket's listeners removed, the socket destroyed unless the
 * tunnel is up) and calls `settle`; an error, a close or the deadline finish it as failed.
 */
function dialEnd<T extends { ok: boolean }>(
  up: Upstream,
  authority: string,
  socket: net.Socket,
  timeoutMs: number,
  settle: (o: T | Refusal) => void,
): (o: T | Refusal) => void {
  let settled = false;
  const finish = (o: T | Refusal) => {
    if (settled) return;
    settled = true;
    clearTimeout(timer);
    socket.off('error', onError);
    socket.off('close', onClose);
    if (!o.ok) socket.destroy();
    settle(o);
  };
  const timer = setTimeout(() => finish({ ok: false, kind: 'failed', why: 'timed out' }), timeoutMs);
  const onError = (err: Error) =>
    finish({ ok: false, kind: 'failed', why: (err as NodeJS.ErrnoException).code ?? 'error' });
  const onClose = () => finish({ ok: false, kind: 'failed', why: 'closed before answering' });
  socket.on('error', onError);
  socket.on('close', onClose);
  socket.once('connect', () => {
    const auth = up.authorization ? `Proxy-Authorization: ${up.authorization}\r\n` : '';
    socket.write(`CONNECT ${authority} HTTP/1.1\r\nHost: ${authority}\r\n${auth}\r\n`);
  });
  return finish;
}

type Refusal = Exclude<DialOutcome, { ok: true }>;

/** The reply head `head[0, end)` as a refusal, or undefined when it opened the tunnel (2xx). */
function refusal(head: Buffer, end: number): Refusal | undefined {
  const m = /^HTTP\/1\.[01] (\d{3}) ?([^\r\n]*)/.exec(head.toString('latin1', 0, Math.min(end, 512)));
  if (!m) return { ok: false, kind: 'failed', why: 'not an HTTP reply' };
  const status = Number(m[1]);
  if (status >= 200 && status < 300) return undefined;
  if (status === 407) return { ok: false, kind: 'failed', why: 'refused our credentials (407)' };
  return { ok: false, kind: 'answered', status, reason: m[2] ?? '' };
}

/**
 * `CONNECT authority` through `up` for a socket this process reads itself (HTTPS inspection
 * speaks TLS over it): ordinary reads, the reply head taken off, the socket handed back paused
 * with anything after the head put back.
 */
export function dialSocket(
  up: Upstream,
  authority: string,
  timeoutMs: number,
): Promise<{ ok: true; socket: net.Socket } | Refusal> {
  return new Promise((resolve) => {
    const socket = net.connect({ host: up.host, port: up.port, noDelay: true });
    let head: Buffer = Buffer.alloc(0);
    const finish = dialEnd<{ ok: true; socket: net.Socket }>(up, authority, socket, timeoutMs, (o) => {
      socket.off('data', onData);
      resolve(o);
    });
    const onData = (chunk: Buffer) => {
      head = Buffer.concat([head, chunk]);
      const end = head.indexOf('\r\n\r\n');
      if (end < 0) {
        if (head.length > MAX_HEAD_BYTES) finish({ ok: false, kind: 'failed', why: 'reply head too long' });
        return;
      }
      socket.pause();
      const refused = refusal(head, end);
      if (!refused && head.length > end + 4) socket.unshift(head.subarray(end + 4));
      finish(refused ?? { ok: true, socket });
    };
    socket.on('data', onData);
  });
}
