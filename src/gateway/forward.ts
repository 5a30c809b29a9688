/**
 * gateway/forward — one absolute-form `http://` request through the gateway: the URL checked,
 * the egress policy applied before any upstream is chosen, then the request handed to the one
 * request pipeline (gateway/exchange) with a transport that sends it in absolute form to the
 * upstream over keep-alive connections (docs/gateway.md). A client that expects `100 Continue`
 * gets it only once the request has an upstream: every refusal comes first.
 */
import type http from 'node:http';
import net from 'node:net';
import { SpanStatusCode } from '@opentelemetry/api';
import { EGRESS_POLICY_HEADER, EGRESS_REFUSAL } from '../provider/local/egress.ts';
import type { GatewayContext } from './context.ts';
import { exchange, plain, type Transport } from './exchange.ts';
import { request } from './http1.ts';
import type { GatewayResult } from './metrics.ts';
import type { RoutingOptions } from './username.ts';

export { plain };

/** Absolute-form requests to the upstream itself, with its credentials, on kept-alive connections. */
function plainTransport(ctx: GatewayContext, url: URL): Transport {
  return {
    kind: 'http',
    request: (a, method, headers) => {
      const out = headers.filter(([k]) => k.toLowerCase() !== 'host');
      out.unshift(['Host', url.host]);
      const up = a.upstream;
      if (up.authorization) out.push(['Proxy-Authorization', up.authorization]);
      return request({
        method,
        target: url.href,
        headers: out,
        pool: ctx.upstreamPool,
        key: [up.host, up.port, up.authorization ?? ''].join('\n'),
        connect: () => connectTcp(up.host, up.port, ctx.limits.upstreamTimeoutMs),
        idleMs: ctx.limits.idleTimeoutMs,
      });
    },
  };
}

/** A new connection to an upstream, or the error that kept it from opening within `timeoutMs`. */
function connectTcp(host: string, port: number, timeoutMs: number): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    const s = net.connect({ host, port, noDelay: true });
    const timer = setTimeout(() => {
      s.destroy();
      reject(Object.assign(new Error('connect timed out'), { code: 'ETIMEDOUT' }));
    }, timeoutMs);
    s.once('error', (err) => {
      clearTimeout(timer);
      reject(err);
    });
    s.once('connect', () => {
      clearTimeout(timer);
      s.removeAllListeners('error');
      resolve(s);
    });
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
  const done = (result: GatewayResult) => {
    ctx.metrics.requests.inc({ kind: 'http', upstream: '', result });
    span.setAttribute('gateway.result', result);
    span.setStatus({ code: SpanStatusCode.ERROR, message: result });
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
  return exchange(ctx, req, res, { host, transport: plainTransport(ctx, url), routing, span });
}
