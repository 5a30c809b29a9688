/**
 * gateway/dial — opens a CONNECT tunnel through one upstream proxy on a raw socket: one write
 * of the CONNECT request, the reply head read by hand, and the socket handed back untouched,
 * so a tunnel costs one round trip to the upstream and no HTTP machinery on the data path
 * (docs/gateway.md, "Why not proxy-chain").
 */
import net from 'node:net';
import type { Upstream } from './upstreams.ts';

/** A reply head longer than this is not a proxy's CONNECT answer. */
const MAX_HEAD_BYTES = 16 * 1024;

export type DialOutcome =
  | { ok: true; socket: net.Socket; rest: Buffer }
  /** The upstream itself failed (refused, reset, timed out, or refused our credentials with 407). */
  | { ok: false; kind: 'failed'; why: string }
  /** The upstream answered but would not open the tunnel (403 by its egress policy, 502 for a dead origin…). */
  | { ok: false; kind: 'answered'; status: number; reason: string };

/** `CONNECT authority` through `up`, giving up after `timeoutMs` (connect plus reply). */
export function dialTunnel(up: Upstream, authority: string, timeoutMs: number): Promise<DialOutcome> {
  return new Promise((resolve) => {
    const socket = net.connect({ host: up.host, port: up.port, noDelay: true });
    let head: Buffer = Buffer.alloc(0);
    let settled = false;
    const finish = (o: DialOutcome) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      socket.off('data', onData);
      socket.off('error', onError);
      socket.off('close', onClose);
      if (!o.ok) socket.destroy();
      resolve(o);
    };
    const timer = setTimeout(() => finish({ ok: false, kind: 'failed', why: 'timed out' }), timeoutMs);
    const onError = (err: Error) =>
      finish({ ok: false, kind: 'failed', why: (err as NodeJS.ErrnoException).code ?? 'error' });
    const onClose = () => finish({ ok: false, kind: 'failed', why: 'closed before answering' });
    const onData = (chunk: Buffer) => {
      head = head.length === 0 ? chunk : Buffer.concat([head, chunk]);
      const end = head.indexOf('\r\n\r\n');
      if (end < 0) {
        if (head.length > MAX_HEAD_BYTES) finish({ ok: false, kind: 'failed', why: 'reply head too long' });
        return;
      }
      const m = /^HTTP\/1\.[01] (\d{3}) ?([^\r\n]*)/.exec(head.toString('latin1', 0, Math.min(end, 512)));
      if (!m) return finish({ ok: false, kind: 'failed', why: 'not an HTTP reply' });
      const status = Number(m[1]);
      if (status >= 200 && status < 300) {
        socket.pause();
        return finish({ ok: true, socket, rest: head.subarray(end + 4) });
      }
      if (status === 407) return finish({ ok: false, kind: 'failed', why: 'refused our credentials (407)' });
      finish({ ok: false, kind: 'answered', status, reason: m[2] ?? '' });
    };
    socket.on('data', onData);
    socket.on('error', onError);
    socket.on('close', onClose);
    socket.once('connect', () => {
      const auth = up.authorization ? `Proxy-Authorization: ${up.authorization}\r\n` : '';
      socket.write(`CONNECT ${authority} HTTP/1.1\r\nHost: ${authority}\r\n${auth}\r\n`);
    });
  });
}
