/**
 * test/support/websocket-echo — the server side of a WebSocket (RFC 6455) that echoes every
 * message, for an HTTP server's 'upgrade' event: enough protocol for a browser's `WebSocket` to
 * open, send and receive unfragmented text or binary messages, and close.
 */
import { createHash } from 'node:crypto';
import type { IncomingMessage } from 'node:http';
import type { Duplex } from 'node:stream';

const ACCEPT_GUID = '258EAFA5-E914-47DA-95CA-C5AB0DC85B11';
const OP_TEXT = 1;
const OP_BINARY = 2;
const OP_CLOSE = 8;

interface Frame {
  opcode: number;
  payload: Buffer;
  /** Bytes of the frame on the wire. */
  size: number;
}

/** A whole frame at the start of `b` (its payload unmasked), or undefined while more is needed. */
function readFrame(b: Buffer): Frame | undefined {
  if (b.length < 2) return undefined;
  const opcode = (b[0] as number) & 0x0f;
  const masked = ((b[1] as number) & 0x80) !== 0;
  let length = (b[1] as number) & 0x7f;
  let at = 2;
  if (length === 126) {
    if (b.length < 4) return undefined;
    length = b.readUInt16BE(2);
    at = 4;
  } else if (length === 127) {
    if (b.length < 10) return undefined;
    length = Number(b.readBigUInt64BE(2));
    at = 10;
  }
  const mask = masked ? b.subarray(at, at + 4) : undefined;
  if (masked) at += 4;
  if (b.length < at + length) return undefined;
  const payload = Buffer.from(b.subarray(at, at + length));
  if (mask)
    for (let i = 0; i < payload.length; i++) payload[i] = (payload[i] as number) ^ (mask[i % 4] as number);
  return { opcode, payload, size: at + length };
}

/** One unmasked frame, as a server sends it. */
function frame(opcode: number, payload: Buffer): Buffer {
  const head =
    payload.length < 126
      ? Buffer.from([0x80 | opcode, payload.length])
      : Buffer.from([0x80 | opcode, 126, payload.length >> 8, payload.length & 0xff]);
  return Buffer.concat([head, payload]);
}

/** Accepts the handshake of `req` on `socket` and echoes every message until the client closes. */
export function acceptEcho(req: IncomingMessage, socket: Duplex): void {
  socket.on('error', () => undefined);
  const key = req.headers['sec-websocket-key'];
  if (typeof key !== 'string' || req.headers.upgrade?.toLowerCase() !== 'websocket') {
    socket.end('HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n');
    return;
  }
  const accept = createHash('sha1').update(`${key}${ACCEPT_GUID}`).digest('base64');
  socket.write(
    `HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ${accept}\r\n\r\n`,
  );
  let buf: Buffer = Buffer.alloc(0);
  socket.on('data', (d: Buffer) => {
    buf = Buffer.concat([buf, d]);
    for (let f = readFrame(buf); f; f = readFrame(buf)) {
      buf = buf.subarray(f.size);
      if (f.opcode === OP_CLOSE) {
        socket.end(frame(OP_CLOSE, f.payload.subarray(0, 2)));
        return;
      }
      if (f.opcode === OP_TEXT || f.opcode === OP_BINARY) socket.write(frame(f.opcode, f.payload));
    }
  });
}
