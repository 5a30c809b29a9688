/**
 * gateway/exchange — the one request pipeline of the gateway (docs/gateway.md, "Rules"): a
 * plain-HTTP request and a request inside an inspected HTTPS connection alike get an upstream
 * from the chooser, go out through a transport (absolute-form to the upstream, or origin-form
 * over TLS through a tunnel, gateway/inspect), and have their answer judged by the response
 * rules (gateway/rules). A rule's `block`, `rateLimit` and `fail` become reports on the upstream;
 * its `retry` sends the request again through the next upstream, so the client sees the blocked
 * answer only when retries run out. Only an answer a `body` rule may match is held back (its
 * first 64 KiB, decoded); every other answer streams through untouched. An upstream that
 * refuses or times out is reported `failed` and tried once more, as before rules existed.
 */
import type http from 'node:http';
import zlib from 'node:zlib';
import { type Span, SpanStatusCode } from '@opentelemetry/api';
import { RULE_BODY_BYTES } from '../config/gateway-rules.ts';
import { expectsContinue, forwardHeaders } from '../provider/local/forward-proxy.ts';
import { EGRESS_PROXY_HEADER, type GatewayContext } from './context.ts';
import { type Answer, AnswerError, type OutgoingRequest } from './http1.ts';
import { joinBothWays } from './join.ts';
import type { GatewayResult } from './metrics.ts';
import {
  headDeadlineMs,
  IDEMPOTENT_METHODS,
  matchBody,
  matchHead,
  type Observed,
  type Rule,
  rulesFor,
  verdict,
} from './rules.ts';
import type { Acquired } from './upstreams.ts';
import type { RoutingOptions } from './username.ts';

/** The header naming why an origin's certificate was refused (inspected HTTPS). */
export const CERTIFICATE_ERROR_HEADER = 'X-Egress-Certificate-Error';
/** Raw bytes read at most while looking for 64 KiB of decoded body. */
const MAX_RAW_PREFIX = 4 * RULE_BODY_BYTES;
/**
 * How much of an answer may wait for a slow client before the answer is paused. Node's own mark
 * (16 KiB) is one TLS record: the relay would pause and resume the answer for every record it
 * passes on; four records measured 5–6 % more inspected bulk (docs/benchmarks.md).
 */
const RELAY_BUFFER_BYTES = 64 * 1024;

/** An error a transport raises for a refused origin certificate: the client gets 502 naming `reason`. */
export class OriginCertificateError extends Error {
  readonly reason: string;
  constructor(reason: string, opts?: { cause?: unknown }) {
    super(`origin certificate refused: ${reason}`, opts);
    this.name = 'OriginCertificateError';
    this.reason = reason;
  }
}

/**
 * An error a transport raises when the tunnel through the upstream stood but TLS with the origin
 * failed for another reason than its certificate (it closed, it does not speak TLS): the site's
 * fault, so the client gets 502 and the upstream is not reported.
 */
export class OriginTlsError extends Error {
  constructor(message: string, opts?: { cause?: unknown }) {
    super(`TLS with the origin failed: ${message}`, opts);
    this.name = 'OriginTlsError';
  }
}

/** An error a transport raises when the upstream answered its CONNECT with a refusal (passed on). */
export class UpstreamAnsweredError extends Error {
  readonly status: number;
  constructor(status: number, reason: string) {
    super(`upstream answered ${status} ${reason}`);
    this.name = 'UpstreamAnsweredError';
    this.status = status;
  }
}

/** How requests leave: one outgoing request through the upstream of `a` (not yet ended). */
export interface Transport {
  /** The `kind` label of the gateway's request metrics. */
  kind: 'http' | 'https';
  request(a: Acquired, method: string, headers: [string, string][]): OutgoingRequest;
}

/** What the exchange needs of the request besides the client's own. */
export interface ExchangeTarget {
  /** The host as leased and matched by rules (no brackets). */
  host: string;
  transport: Transport;
  routing: RoutingOptions;
  span: Span;
  /**
   * The protocol the client asks to switch to (`websocket`), for a request whose connection the
   * client gave up to this exchange (gateway/inspect's upgrade route): a `101` answer then joins
   * the client and the origin, as a tunnel does.
   */
  upgrade?: string;
}

export function plain(
  res: http.ServerResponse,
  status: number,
  body: string,
  upstream?: string,
  extra: Record<string, string> = {},
): void {
  if (res.headersSent) {
    res.destroy();
    return;
  }
  const headers: Record<string, string> = {
    'Content-Type': 'text/plain; charset=utf-8',
    Connection: 'close',
  };
  if (upstream) headers[EGRESS_PROXY_HEADER] = upstream;
  Object.assign(headers, extra);
  res.writeHead(status, headers).end(`${body}\n`);
}

export function hasBody(req: http.IncomingMessage): boolean {
  const length = req.headers['content-length'];
  return req.headers['transfer-encoding'] !== undefined || (length !== undefined && length !== '0');
}

/** The request body as sent the first time, kept for a retry while it stays within 64 KiB. */
class ReplayBody {
  private chunks: Buffer[] = [];
  private size = 0;
  private overflow = false;
  uploaded = 0;
  private readonly req: http.IncomingMessage;
  constructor(req: http.IncomingMessage) {
    this.req = req;
  }
  /**
   * Sends the body to `upReq` as it arrives, keeping a copy. Called once, right where the pipe
   * starts: a 'data' listener set any earlier would let chunks flow before anyone sends them.
   */
  pipeTo(upReq: OutgoingRequest): void {
    this.req.on('data', (c: Buffer) => {
      this.uploaded += c.length;
      if (this.overflow) return;
      this.size += c.length;
      if (this.size > RULE_BODY_BYTES) {
        this.overflow = true;
        this.chunks = [];
      } else this.chunks.push(c);
    });
    this.req.pipe(upReq);
  }
  /** Whether the whole body is here to be sent again. */
  get replayable(): boolean {
    return !this.overflow && this.req.complete;
  }
  bytes(): Buffer {
    return Buffer.concat(this.chunks);
  }
}

type Sent =
  | { kind: 'answered'; res: Answer; ttfbMs: number }
  | { kind: 'failed'; why: string; timedOut: boolean }
  | { kind: 'certificate'; reason: string }
  | { kind: 'origin'; message: string }
  | { kind: 'refused'; status: number; message: string };

/** Sends the request once through `a`; resolves on the answer's head, a failure or the deadline. */
function send(
  target: ExchangeTarget,
  req: http.IncomingMessage,
  a: Acquired,
  body: ReplayBody | undefined,
  first: boolean,
  deadlineMs: number,
): Promise<Sent> {
  return new Promise((resolve) => {
    const headers = forwardHeaders(req.rawHeaders).filter(([k]) => k.toLowerCase() !== 'proxy-authorization');
    // Hop-by-hop, so not forwarded as they came: the switch is asked for again on this hop.
    if (target.upgrade) headers.push(['Connection', 'Upgrade'], ['Upgrade', target.upgrade]);
    const started = performance.now();
    const upReq = target.transport.request(a, req.method ?? 'GET', headers);
    let settled = false;
    const settle = (s: Sent) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      resolve(s);
    };
    const timer = setTimeout(() => {
      upReq.destroy();
      settle({ kind: 'failed', why: 'timed out', timedOut: true });
    }, deadlineMs);
    upReq.once('response', (res: Answer) => {
      if (res.statusCode === 407 && target.transport.kind === 'http') {
        res.resume();
        settle({ kind: 'failed', why: 'refused our credentials (407)', timedOut: false });
      } else settle({ kind: 'answered', res, ttfbMs: performance.now() - started });
    });
    upReq.on('error', (err) => {
      if (err instanceof OriginCertificateError) settle({ kind: 'certificate', reason: err.reason });
      else if (err instanceof OriginTlsError) settle({ kind: 'origin', message: err.message });
      else if (err instanceof AnswerError && err.code === 'EPROTO' && target.transport.kind === 'https') {
        // The origin itself broke HTTP (a malformed head, an upgrade): its fault, not the upstream's.
        settle({ kind: 'origin', message: `the origin's answer was refused: ${err.message}` });
      } else if (err instanceof UpstreamAnsweredError) {
        settle({ kind: 'refused', status: err.status, message: err.message });
      } else
        settle({ kind: 'failed', why: (err as NodeJS.ErrnoException).code ?? err.message, timedOut: false });
    });
    if (!body) upReq.end();
    else if (first) body.pipeTo(upReq);
    else upReq.end(body.bytes());
  });
}

/** The start of an answer's body, read for `body` rules: the raw bytes and their decoded text. */
interface Prefix {
  raw: Buffer[];
  text: string;
  ended: boolean;
  /** The answer broke off within the prefix (its body was cut short). */
  failed: boolean;
}

/**
 * Whether a `deflate` body starts with the zlib header it should have (RFC 9110); some servers
 * send raw deflate under that name, which browsers read too.
 */
function hasZlibHeader(first: Buffer): boolean {
  if (first.length < 2) return true;
  const cmf = first[0] as number;
  return (cmf & 0x0f) === 8 && ((cmf << 8) | (first[1] as number)) % 31 === 0;
}

/** The decoder of a body in `encoding` that starts with `first`; none for an identity body. */
function decoderFor(
  encoding: string | undefined,
  first: Buffer,
): zlib.Gunzip | zlib.Inflate | zlib.InflateRaw | zlib.BrotliDecompress | undefined {
  const e = (encoding ?? '').trim().toLowerCase();
  const flush = { finishFlush: zlib.constants.Z_SYNC_FLUSH };
  if (e === 'gzip' || e === 'x-gzip') return zlib.createGunzip(flush);
  if (e === 'deflate') return hasZlibHeader(first) ? zlib.createInflate(flush) : zlib.createInflateRaw(flush);
  if (e === 'br') {
    return zlib.createBrotliDecompress({ finishFlush: zlib.constants.BROTLI_OPERATION_FLUSH });
  }
  return undefined;
}

/** Reads up to 64 KiB of decoded body (or the whole body if shorter) and pauses the answer. */
function readPrefix(res: Answer): Promise<Prefix> {
  return new Promise((resolve) => {
    const raw: Buffer[] = [];
    let rawSize = 0;
    const decoded: Buffer[] = [];
    let decodedSize = 0;
    let ended = false;
    let failed = false;
    let done = false;
    /** Chosen by the body's first bytes (null until they came). */
    let decoder: ReturnType<typeof decoderFor> | null = null;
    const finish = () => {
      if (done) return;
      done = true;
      res.off('data', onData);
      res.off('end', onEnd);
      res.off('error', onError);
      res.pause();
      decoder?.destroy();
      const text = Buffer.concat(decoded).subarray(0, RULE_BODY_BYTES).toString('utf8');
      resolve({ raw, text, ended, failed });
    };
    const take = (d: Buffer) => {
      decoded.push(d);
      decodedSize += d.length;
      if (decodedSize >= RULE_BODY_BYTES) finish();
    };
    const onData = (chunk: Buffer) => {
      if (decoder === null) {
        decoder = decoderFor(res.headers['content-encoding'] as string | undefined, chunk);
        decoder?.on('data', take);
        decoder?.on('error', finish);
        decoder?.on('end', finish);
      }
      raw.push(chunk);
      rawSize += chunk.length;
      if (decoder) decoder.write(chunk);
      else take(chunk);
      if (rawSize >= MAX_RAW_PREFIX) {
        res.pause();
        if (decoder) decoder.flush(finish);
        else finish();
      }
    };
    const onError = () => {
      failed = true;
      onEnd();
    };
    const onEnd = () => {
      ended = true;
      if (decoder) decoder.end();
      else finish();
    };
    res.on('data', onData);
    res.once('end', onEnd);
    res.once('error', onError);
    res.resume();
  });
}

/** Handles one request whose egress was allowed: upstreams, transport, rules, the answer. */
export async function exchange(
  ctx: GatewayContext,
  req: http.IncomingMessage,
  res: http.ServerResponse,
  target: ExchangeTarget,
): Promise<void> {
  const { span, transport } = target;
  const kind = transport.kind;
  const done = (result: GatewayResult, upstream = '') => {
    ctx.metrics.requests.inc({ kind, upstream, result });
    span.setAttribute('gateway.result', result);
    if (result !== 'ok') span.setStatus({ code: SpanStatusCode.ERROR, message: result });
    span.end();
  };
  const rules = rulesFor(ctx.rules, target.host);
  const deadline = headDeadlineMs(rules, ctx.limits.upstreamTimeoutMs);
  const method = (req.method ?? 'GET').toUpperCase();
  const body = hasBody(req) ? new ReplayBody(req) : undefined;
  let failures = 0;
  let retried = 0;
  /** The upstream a retry already took (so the answer it replaces was kept until it had one). */
  let next: Acquired | undefined;
  for (let attempt = 1; ; attempt++) {
    if (res.destroyed) {
      if (next) ctx.chooser.release(next);
      return done('client_gone');
    }
    let a: Acquired;
    if (next) a = next;
    else {
      const got = await ctx.chooser.acquire(target.host, target.routing);
      if (!got.ok) {
        done('no_upstream');
        return plain(res, got.status, got.message);
      }
      a = got.acquired;
    }
    next = undefined;
    const key = a.upstream.key;
    span.setAttribute('gateway.upstream', key);
    // Authenticated, allowed by the policy and given an upstream: only now is the body wanted.
    if (attempt === 1 && expectsContinue(req)) res.writeContinue();
    const sent = await send(target, req, a, body, attempt === 1, deadline);
    const replayable = body === undefined || body.replayable;
    if (sent.kind === 'certificate') {
      ctx.chooser.release(a);
      ctx.log.info({ upstream: key, target: target.host, reason: sent.reason }, 'origin certificate refused');
      done('certificate_error', key);
      return plain(res, 502, `origin certificate refused for ${target.host}: ${sent.reason}`, key, {
        [CERTIFICATE_ERROR_HEADER]: sent.reason,
      });
    }
    if (sent.kind === 'origin') {
      ctx.chooser.release(a);
      done('failed', key);
      return plain(res, 502, `${target.host}: ${sent.message}`, key);
    }
    if (sent.kind === 'refused') {
      ctx.chooser.release(a);
      done('ok', key);
      return plain(res, sent.status, sent.message, key);
    }
    let observed: Observed;
    let prefix: Prefix | undefined;
    let matched: Rule[];
    if (sent.kind === 'failed') {
      observed = { timedOut: true };
      matched = sent.timedOut ? matchHead(rules, observed).matched : [];
    } else {
      observed = {
        timedOut: false,
        status: sent.res.statusCode ?? 502,
        headers: sent.res.headers,
        ttfbMs: sent.ttfbMs,
      };
      const head = matchHead(rules, observed);
      matched = head.matched;
      if (head.needBody.length > 0) {
        prefix = await readPrefix(sent.res);
        matched = [...matched, ...matchBody(head.needBody, prefix.text)];
      }
    }
    const v = verdict(matched, observed, ctx.clock.now());
    countMatches(ctx, span, matched);
    if (sent.kind === 'failed' && matched.length === 0) {
      // No rule speaks for this failure: the upstream failed, as it always has.
      ctx.log.info({ upstream: key, why: sent.why, attempt }, 'upstream failed a request; reported failed');
      report(ctx, a, 'failed');
      ctx.chooser.release(a);
      if (++failures < 2 && body === undefined && !res.destroyed) continue;
      done('failed', key);
      return plain(res, 502, 'upstream proxy failed', key);
    }
    if (v.fail) report(ctx, a, 'failed');
    else if (v.rateLimitSeconds !== undefined) report(ctx, a, 'blocked', v.rateLimitSeconds);
    else if (v.block) report(ctx, a, 'blocked');
    const retryAllowed = v.retryUnsafe || IDEMPOTENT_METHODS.has(method);
    if (retried < v.retries && retryAllowed && replayable && !res.destroyed) {
      // The answer is dropped only once another upstream took the request: with none left, the
      // client gets this answer rather than a 503.
      const got = await ctx.chooser.acquire(target.host, target.routing);
      if (got.ok) {
        retried++;
        next = got.acquired;
        if (sent.kind === 'answered') sent.res.destroy();
        ctx.chooser.release(a);
        span.addEvent('gateway retry', { 'gateway.upstream': key, 'gateway.rule': names(matched) });
        continue;
      }
    }
    if (sent.kind === 'failed') {
      ctx.chooser.release(a);
      done('failed', key);
      return plain(res, 504, `upstream gave no answer in time (rule ${names(matched)})`, key);
    }
    const blocked = v.block || v.rateLimitSeconds !== undefined || v.fail;
    return relay(ctx, a, res, sent.res, prefix, body, blocked, kind, done);
  }
}

function names(rules: readonly Rule[]): string {
  return rules.map((r) => r.name).join(',');
}

function report(
  ctx: GatewayContext,
  a: Acquired,
  result: 'blocked' | 'failed',
  cooldownSeconds?: number,
): void {
  ctx.chooser.report(a, result, cooldownSeconds);
  ctx.metrics.reports.inc({ upstream: a.upstream.key, result });
}

function countMatches(ctx: GatewayContext, span: Span, matched: readonly Rule[]): void {
  if (matched.length === 0) return;
  for (const r of matched) {
    const mode = r.observe ? 'observe' : 'enforce';
    for (const action of r.actions) ctx.metrics.ruleMatches.inc({ rule: r.name, action, mode });
  }
  span.setAttribute('gateway.rule', names(matched));
}

/** Streams the upstream's answer to the client, naming the upstream; a held-back start goes first. */
function relay(
  ctx: GatewayContext,
  a: Acquired,
  res: http.ServerResponse,
  upstreamRes: Answer,
  prefix: Prefix | undefined,
  body: ReplayBody | undefined,
  blocked: boolean,
  kind: 'http' | 'https',
  done: (result: GatewayResult, upstream?: string) => void,
): void {
  const key = a.upstream.key;
  const status = upstreamRes.statusCode ?? 502;
  if (res.destroyed) {
    // The client left while the upstream answered: its close event has already passed.
    upstreamRes.destroy();
    ctx.chooser.release(a);
    done('client_gone', key);
    return;
  }
  if (upstreamRes.upgraded) {
    switchProtocols(ctx, a, res, upstreamRes, upstreamRes.upgraded, done);
    return;
  }
  ctx.metrics.open.inc({ kind });
  ctx.hold(a, () => res.destroy());
  let bytes = 0;
  for (const c of prefix?.raw ?? []) bytes += c.length;
  const headers = forwardHeaders(upstreamRes.rawHeaders);
  headers.push([EGRESS_PROXY_HEADER, key]);
  res.writeHead(status, upstreamRes.statusMessage, headers.flat());
  for (const c of prefix?.raw ?? []) res.write(c);
  // Before the answer flows: a body cut short may fail it as soon as it resumes.
  upstreamRes.on('error', () => res.destroy());
  if (prefix?.failed) res.destroy();
  else if (prefix?.ended) res.end();
  else {
    const client = res.socket;
    let corked = false;
    const uncork = () => {
      corked = false;
      client?.uncork();
    };
    upstreamRes.on('data', (chunk: Buffer) => {
      bytes += chunk.length;
      // What arrives within one turn of the event loop (several reads of the origin, a TLS
      // record each) goes to the client as one write: fewer, larger writes cost less on both
      // sides (docs/benchmarks.md, "Inspected HTTPS").
      if (client && !corked) {
        corked = true;
        client.cork();
        setImmediate(uncork);
      }
      if (!res.write(chunk, () => release(chunk)) && res.writableLength >= RELAY_BUFFER_BYTES) {
        upstreamRes.pause();
      }
    });
    res.on('drain', () => upstreamRes.resume());
    upstreamRes.once('end', () => res.end());
    upstreamRes.resume();
  }
  res.once('close', () => {
    if (!res.writableFinished) upstreamRes.destroy();
    ctx.metrics.open.dec({ kind });
    ctx.metrics.bytes.inc({ upstream: key, direction: 'sent' }, body?.uploaded ?? 0);
    ctx.metrics.bytes.inc({ upstream: key, direction: 'received' }, bytes);
    ctx.letGo(a);
    done(blocked ? 'blocked' : res.writableFinished ? 'ok' : 'client_gone', key);
  });
}

/**
 * The origin switched protocols (`101`): the answer's head goes to the client as it came (its
 * `Connection` and `Upgrade` said again, hop-by-hop), then the client's connection, taken from
 * its response, and the origin's are joined until either ends, the lease held meanwhile.
 */
function switchProtocols(
  ctx: GatewayContext,
  a: Acquired,
  res: http.ServerResponse,
  answer: Answer,
  upgraded: NonNullable<Answer['upgraded']>,
  done: (result: GatewayResult, upstream?: string) => void,
): void {
  const key = a.upstream.key;
  const client = res.socket;
  if (!client) {
    upgraded.socket.destroy();
    ctx.chooser.release(a);
    done('client_gone', key);
    return;
  }
  res.detachSocket(client);
  const headers = forwardHeaders(answer.rawHeaders);
  headers.push(['Connection', 'Upgrade'], ['Upgrade', String(answer.headers.upgrade ?? '')]);
  headers.push([EGRESS_PROXY_HEADER, key]);
  let head = `HTTP/1.1 101 ${answer.statusMessage || 'Switching Protocols'}\r\n`;
  for (const [k, v] of headers) head += `${k}: ${v}\r\n`;
  client.write(`${head}\r\n`);
  if (upgraded.rest.length > 0) client.write(upgraded.rest);
  const far = upgraded.socket;
  joinBothWays(ctx, a, client, far, {
    kind: 'https',
    farToClient: () => far.pipe(client),
    onClosed: () => done('ok', key),
  });
}

/**
 * Frees a body chunk's memory as soon as the client's socket has taken it (its write completed),
 * when the chunk is the whole of its ArrayBuffer: Node's HTTP parser copies every body chunk into
 * a buffer of its own, and left to the garbage collector those buffers pile up between
 * collections and start full ones (docs/benchmarks.md, "Inspected HTTPS"). Nothing else holds a
 * relayed chunk; a chunk that shares its memory is left alone.
 */
function release(chunk: Buffer): void {
  const ab = chunk.buffer;
  if (!(ab instanceof ArrayBuffer) || chunk.byteOffset !== 0 || chunk.byteLength !== ab.byteLength) return;
  // ArrayBuffer.prototype.transfer (ES2024, in every Node this runs on): detaches `ab`, freeing its memory.
  (ab as ArrayBuffer & { transfer(length: number): ArrayBuffer }).transfer(0);
}
