/**
 * gateway/forward — one absolute-form `http://` request through the gateway: the egress policy
 * first, then an upstream from the chooser and the request sent to it in absolute form. Answers
 * with a configured status (default 403, 429) report the upstream `blocked` for the host; an
 * upstream that refuses, times out or answers 407 is reported `failed` and a request without a
 * body is sent once more through another upstream (docs/gateway.md). A client that expects
 * `100 Continue` gets it only once the request has an upstream: every refusal comes first.
 */
import http from 'node:http';
import { SpanStatusCode } from '@opentelemetry/api';
import { EGRESS_POLICY_HEADER, EGRESS_REFUSAL } from '../provider/local/egress.ts';
import { forwardHeaders } from '../provider/local/forward-proxy.ts';
import { EGRESS_PROXY_HEADER, type GatewayContext } from './context.ts';
import type { GatewayResult } from './metrics.ts';
import type { Acquired } from './upstreams.ts';
import type { RoutingOptions } from './username.ts';

/** Keep-alive connections to upstreams, shared by every forwarded request. */
const agent = new http.Agent({ keepAlive: true, maxFreeSockets: 64 });

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

/** The client waits for `100 Continue` before it sends its body (the pattern Node's server uses). */
function expectsContinue(req: http.IncomingMessage): boolean {
  return /(?:^|\W)100-continue(?:$|\W)/i.test(req.headers.expect ?? '');
}

function hasBody(req: http.IncomingMessage): boolean {
  const length = req.headers['content-length'];
  return req.headers['transfer-encoding'] !== undefined || (length !== undefined && length !== '0');
}

type Sent = { kind: 'answered'; upstreamRes: http.IncomingMessage } | { kind: 'failed'; why: string };

/**
 * Sends `req` to `url` through the upstream of `a`; resolves once the upstream answered or
 * failed. `uploaded` is told the size of every piece of the body sent on.
 */
function send(
  ctx: GatewayContext,
  req: http.IncomingMessage,
  url: URL,
  a: Acquired,
  uploaded: (bytes: number) => void,
): Promise<Sent> {
  return new Promise((resolve) => {
    const headers = forwardHeaders(req.rawHeaders).filter(([k]) => k.toLowerCase() !== 'host');
    headers.unshift(['Host', url.host]);
    if (a.upstream.authorization) headers.push(['Proxy-Authorization', a.upstream.authorization]);
    const upReq = http.request({
      host: a.upstream.host,
      port: a.upstream.port,
      method: req.method,
      path: url.href,
      headers: headers.flat(),
      agent,
    });
    const timer = setTimeout(() => {
      upReq.destroy();
      resolve({ kind: 'failed', why: 'timed out' });
    }, ctx.limits.upstreamTimeoutMs);
    upReq.once('response', (upstreamRes) => {
      clearTimeout(timer);
      if (upstreamRes.statusCode === 407) {
        upstreamRes.resume();
        resolve({ kind: 'failed', why: 'refused our credentials (407)' });
      } else resolve({ kind: 'answered', upstreamRes });
    });
    upReq.on('error', (err) => {
      clearTimeout(timer);
      resolve({ kind: 'failed', why: (err as NodeJS.ErrnoException).code ?? 'error' });
    });
    if (hasBody(req)) {
      req.on('data', (chunk: Buffer) => uploaded(chunk.length));
      req.pipe(upReq);
    } else upReq.end();
  });
}

/** Handles one authenticated absolute-form request. */
export async function handleForward(
  ctx: GatewayContext,
  req: http.IncomingMessage,
  res: http.ServerResponse,
  routing: RoutingOptions,
): Promise<void> {
  const span = ctx.tracer.startSpan('gateway HTTP', {
    attributes: { 'http.request.method': req.method ?? '' },
  });
  const done = (result: GatewayResult, upstream = '') => {
    ctx.metrics.requests.inc({ kind: 'http', upstream, result });
    span.setAttribute('gateway.result', result);
    if (result !== 'ok') span.setStatus({ code: SpanStatusCode.ERROR, message: result });
    span.end();
  };
  let url: URL;
  try {
    url = new URL(req.url ?? '');
  } catch {
    done('bad_request');
    return plain(res, 400, 'the gateway is a forward proxy: send absolute-form http:// URLs, or CONNECT');
  }
  if (url.protocol !== 'http:') {
    done('bad_request');
    return plain(res, 400, 'only http:// URLs are forwarded; use CONNECT for https');
  }
  const host = url.hostname.replace(/^\[(.*)\]$/, '$1');
  const port = url.port === '' ? 80 : Number(url.port);
  const decision = await ctx.egress.decide(host, port, {
    method: req.method ?? 'GET',
    path: `${url.pathname}${url.search}`,
  });
  if (!decision.allowed) {
    const unresolvable = decision.reason === 'unresolvable';
    done(unresolvable ? 'bad_request' : 'denied');
    if (unresolvable) return plain(res, 502, 'target host does not resolve');
    ctx.log.debug(
      { target: url.host, reason: decision.reason, rule: decision.rule },
      'egress denied by rule',
    );
    return plain(res, 403, `${EGRESS_REFUSAL}: ${decision.rule}`, undefined, {
      [EGRESS_POLICY_HEADER]: decision.rule,
    });
  }
  const retryable = !hasBody(req);
  let uploaded = 0;
  const count = (bytes: number) => {
    uploaded += bytes;
  };
  for (let attempt = 1; attempt <= (retryable ? 2 : 1); attempt++) {
    const got = await ctx.chooser.acquire(host, routing);
    if (!got.ok) {
      done('no_upstream');
      return plain(res, got.status, got.message);
    }
    const a = got.acquired;
    const key = a.upstream.key;
    span.setAttribute('gateway.upstream', key);
    // Authenticated, allowed by the policy and given an upstream: only now is the body wanted.
    if (attempt === 1 && expectsContinue(req)) res.writeContinue();
    const sent = await send(ctx, req, url, a, count);
    if (sent.kind === 'answered') return relay(ctx, a, res, sent.upstreamRes, () => uploaded, done);
    ctx.log.info({ upstream: key, why: sent.why, attempt }, 'upstream failed a request; reported failed');
    ctx.chooser.report(a, 'failed');
    ctx.metrics.reports.inc({ upstream: key, result: 'failed' });
    ctx.chooser.release(a);
    if (attempt === (retryable ? 2 : 1) || res.destroyed) {
      done('failed', key);
      return plain(res, 502, 'upstream proxy failed', key);
    }
  }
}

/** Streams the upstream's answer to the client, naming the upstream; blocked statuses are reported. */
function relay(
  ctx: GatewayContext,
  a: Acquired,
  res: http.ServerResponse,
  upstreamRes: http.IncomingMessage,
  uploaded: () => number,
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
  const blocked = ctx.blockedStatuses.has(status);
  if (blocked) {
    ctx.chooser.report(a, 'blocked');
    ctx.metrics.reports.inc({ upstream: key, result: 'blocked' });
  }
  ctx.metrics.open.inc({ kind: 'http' });
  ctx.hold(a, () => res.destroy());
  let bytes = 0;
  upstreamRes.on('data', (chunk: Buffer) => {
    bytes += chunk.length;
  });
  const headers = forwardHeaders(upstreamRes.rawHeaders);
  headers.push([EGRESS_PROXY_HEADER, key]);
  res.writeHead(status, upstreamRes.statusMessage, headers.flat());
  upstreamRes.pipe(res);
  upstreamRes.on('error', () => res.destroy());
  res.once('close', () => {
    if (!res.writableFinished) upstreamRes.destroy();
    ctx.metrics.open.dec({ kind: 'http' });
    ctx.metrics.bytes.inc({ upstream: key, direction: 'sent' }, uploaded());
    ctx.metrics.bytes.inc({ upstream: key, direction: 'received' }, bytes);
    ctx.letGo(a);
    done(blocked ? 'blocked' : res.writableFinished ? 'ok' : 'client_gone', key);
  });
}
