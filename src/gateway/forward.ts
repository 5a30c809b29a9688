/**
 * gateway/forward — one absolute-form `http://` request through the gateway: the URL checked,
 * the egress policy applied before any upstream is chosen, then the request handed to the one
 * request pipeline (gateway/exchange) with a transport that sends it in absolute form to the
 * upstream over keep-alive connections (docs/gateway.md). A client that expects `100 Continue`
 * gets it only once the request has an upstream: every refusal comes first.
 */
import http from 'node:http';
import { SpanStatusCode } from '@opentelemetry/api';
import { EGRESS_POLICY_HEADER, EGRESS_REFUSAL } from '../provider/local/egress.ts';
import type { GatewayContext } from './context.ts';
import { exchange, plain, type Transport } from './exchange.ts';
import type { GatewayResult } from './metrics.ts';
import type { RoutingOptions } from './username.ts';

export { plain };

/** Keep-alive connections to upstreams, shared by every forwarded request. */
const agent = new http.Agent({ keepAlive: true, maxFreeSockets: 64 });

/** Absolute-form requests to the upstream itself, with its credentials. */
function plainTransport(url: URL): Transport {
  return {
    kind: 'http',
    request: (a, method, headers) => {
      const out = headers.filter(([k]) => k.toLowerCase() !== 'host');
      out.unshift(['Host', url.host]);
      if (a.upstream.authorization) out.push(['Proxy-Authorization', a.upstream.authorization]);
      return http.request({
        host: a.upstream.host,
        port: a.upstream.port,
        method,
        path: url.href,
        headers: out.flat(),
        agent,
      });
    },
  };
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
  return exchange(ctx, req, res, { host, transport: plainTransport(url), routing, span });
}
