/**
 * gateway/http1-wire — what the gateway's HTTP/1.1 client (gateway/http1) reads off the wire,
 * with no I/O of its own: an answer head parsed and checked (status line, header names and values
 * Node would send on, conflicting lengths, folded lines refused), the body's framing decided
 * (none for an answer to HEAD or a 1xx/204/304 status; chunked when the last transfer coding is
 * chunked; else Content-Length; else until the far side closes), and chunked framing read
 * without copying the data.
 */
import type http from 'node:http';

/** An answer head longer than this is refused (Node's own parser stops at 16 KiB). */
export const MAX_HEAD_BYTES = 64 * 1024;
const TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
/** What Node refuses in a header value or reason phrase it sends on. */
const INVALID_VALUE = /[^\t\x20-\x7e\x80-\xff]/;
/** Headers whose repeats Node's parser drops (first wins) rather than joins. */
const SINGLE = new Set([
  'age',
  'authorization',
  'content-length',
  'content-type',
  'etag',
  'expires',
  'from',
  'host',
  'if-modified-since',
  'if-unmodified-since',
  'last-modified',
  'location',
  'max-forwards',
  'proxy-authorization',
  'referer',
  'retry-after',
  'server',
  'user-agent',
]);

export type Framing =
  | { kind: 'none' }
  | { kind: 'length'; bytes: number }
  | { kind: 'chunked' }
  | { kind: 'close' };

export interface AnswerHead {
  statusCode: number;
  statusMessage: string;
  /** HTTP/1.1 (or 1.0 asking for keep-alive) without `Connection: close`. */
  keepAlive: boolean;
  rawHeaders: string[];
  headers: http.IncomingHttpHeaders;
  framing: Framing;
}

/**
 * Parses the answer head `head[0, end)` (without its blank line) to what an answer to `method`
 * carries; a string says what is wrong with it.
 */
export function parseAnswerHead(head: Buffer, end: number, method: string): AnswerHead | string {
  const lines = head.toString('latin1', 0, end).split('\r\n');
  const status = /^HTTP\/1\.([01]) (\d{3})(?: (.*))?$/.exec(lines[0] ?? '');
  if (!status) return 'not an HTTP/1.x status line';
  const minor = status[1];
  const statusCode = Number(status[2]);
  const statusMessage = status[3] ?? '';
  if (statusCode < 100) return `status ${statusCode} out of range`;
  if (INVALID_VALUE.test(statusMessage)) return 'invalid character in the reason phrase';
  const rawHeaders: string[] = [];
  const headers: http.IncomingHttpHeaders = {};
  const lengths = new Set<string>();
  let chunked = false;
  let encoded = false;
  let close = minor === '0';
  for (let i = 1; i < lines.length; i++) {
    const line = lines[i] as string;
    if (line.startsWith(' ') || line.startsWith('\t')) return 'folded header line';
    const colon = line.indexOf(':');
    const name = colon > 0 ? line.slice(0, colon) : '';
    if (!TOKEN.test(name)) return `invalid header line ${JSON.stringify(line.slice(0, 40))}`;
    const value = line.slice(colon + 1).trim();
    if (INVALID_VALUE.test(value)) return `invalid character in header ${name}`;
    rawHeaders.push(name, value);
    const lower = name.toLowerCase();
    if (lower === 'set-cookie') headers['set-cookie'] = [...(headers['set-cookie'] ?? []), value];
    else if (headers[lower] === undefined) headers[lower] = value;
    else if (!SINGLE.has(lower)) headers[lower] = `${headers[lower]}, ${value}`;
    if (lower === 'content-length') for (const v of value.split(',')) lengths.add(v.trim());
    else if (lower === 'transfer-encoding') {
      encoded = true;
      chunked = /(?:^|,)\s*chunked\s*$/i.test(value);
    } else if (lower === 'connection') {
      const tokens = value
        .toLowerCase()
        .split(',')
        .map((t) => t.trim());
      if (tokens.includes('close')) close = true;
      else if (minor === '0' && tokens.includes('keep-alive')) close = false;
    }
  }
  let framing: Framing;
  if (method === 'HEAD' || statusCode < 200 || statusCode === 204 || statusCode === 304) {
    framing = { kind: 'none' };
  } else if (encoded) {
    framing = chunked ? { kind: 'chunked' } : { kind: 'close' };
    // A length beside a transfer coding is a smuggling tell: the connection is not kept.
    if (lengths.size > 0) close = true;
  } else if (lengths.size > 0) {
    const [only] = lengths;
    if (lengths.size > 1 || !/^\d{1,15}$/.test(only ?? '')) return 'invalid Content-Length';
    framing = { kind: 'length', bytes: Number(only) };
  } else framing = { kind: 'close' };
  return {
    statusCode,
    statusMessage,
    keepAlive: !close && framing.kind !== 'close',
    rawHeaders,
    headers,
    framing,
  };
}

/**
 * Reads chunked framing: `feed` takes raw bytes and calls `data` with each slice of body (never
 * copied) until the last chunk and its trailers have passed; it returns how many bytes it used.
 */
export class ChunkedReader {
  private state: 'size' | 'data' | 'data-end' | 'trailer' | 'done' = 'size';
  private line = '';
  private left = 0;

  get done(): boolean {
    return this.state === 'done';
  }

  /** Consumes from `buf`; stops early when `data` returns false (the consumer paused). */
  feed(buf: Buffer, data: (slice: Buffer) => boolean): number | string {
    let i = 0;
    while (i < buf.length && this.state !== 'done') {
      if (this.state === 'data') {
        const n = Math.min(this.left, buf.length - i);
        this.left -= n;
        const slice = buf.subarray(i, i + n);
        i += n;
        if (this.left === 0) this.state = 'data-end';
        if (!data(slice)) return i;
        continue;
      }
      const nl = buf.indexOf(10, i);
      const upto = nl < 0 ? buf.length : nl + 1;
      this.line += buf.toString('latin1', i, upto);
      i = upto;
      if (this.line.length > 4096) return 'chunk line too long';
      if (nl < 0) continue;
      if (!this.line.endsWith('\r\n')) return 'chunk line without CRLF';
      const line = this.line.slice(0, -2);
      this.line = '';
      if (this.state === 'data-end') {
        if (line !== '') return 'chunk data longer than its size';
        this.state = 'size';
      } else if (this.state === 'size') {
        const size = /^([0-9A-Fa-f]{1,12})[ \t]*(?:;.*)?$/.exec(line);
        if (!size) return 'invalid chunk size';
        this.left = Number.parseInt(size[1] as string, 16);
        this.state = this.left === 0 ? 'trailer' : 'data';
      } else if (line === '') this.state = 'done';
    }
    return i;
  }
}
