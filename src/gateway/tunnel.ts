/**
 * gateway/tunnel — one CONNECT through the gateway: the egress policy first, then an upstream
 * from the chooser, a tunnel through it (gateway/dial), and both sockets piped together. An
 * upstream that fails is reported `failed` and the CONNECT is tried once more on another one
 * (docs/gateway.md, "Failures and retries"). With inspection on, the CONNECT is answered once
 * the egress policy allowed it, and handed to gateway/inspect when the client opens TLS; any
 * other protocol goes through a tunnel as here, its CONNECT already answered.
 */

import type net from 'node:net';
import { type Span, SpanStatusCode } from '@opentelemetry/api';
import { EGRESS_POLICY_HEADER, EGRESS_REFUSAL } from '../provider/local/egress.ts';
import { endRaw, parseAuthority } from '../provider/local/forward-proxy.ts';
import { EGRESS_PROXY_HEADER, type GatewayContext } from './context.ts';
import { dialTunnel, type UpstreamReader } from './dial.ts';
import { clientOpening, type Inspector, opensTls } from './inspect.ts';
import { joinBothWays } from './join.ts';
import type { GatewayResult } from './metrics.ts';
import type { Acquired } from './upstreams.ts';
import type { RoutingOptions } from './username.ts';

/** The one raw answer writer, shared with the local proxies (server.ts answers with it too). */
export { endRaw };

/** Handles one authenticated CONNECT `authority` from `client`. */
export async function handleConnect(
  ctx: GatewayContext,
  client: net.Socket,
  authority: string,
  head: Buffer,
  routing: RoutingOptions,
  inspector?: Inspector,
): Promise<void> {
  const span = ctx.tracer.startSpan('gateway CONNECT', { attributes: { 'server.address': authority } });
  const done = (result: GatewayResult, upstream = '') => {
    ctx.metrics.requests.inc({ kind: 'connect', upstream, result });
    span.setAttribute('gateway.result', result);
    if (result !== 'ok') span.setStatus({ code: SpanStatusCode.ERROR, message: result });
  };
  const target = parseAuthority(authority);
  if (!target) {
    done('bad_request');
    span.end();
    return endRaw(client, 400, 'Bad Request', [], 'CONNECT needs host:port\n');
  }
  const decision = await ctx.egress.decide(target.host, target.port);
  if (!decision.allowed) {
    const unresolvable = decision.reason === 'unresolvable';
    done(unresolvable ? 'bad_request' : 'denied');
    span.end();
    if (unresolvable) return endRaw(client, 502, 'Bad Gateway', [], 'target host does not resolve\n');
    ctx.log.debug(
      { target: authority, reason: decision.reason, rule: decision.rule },
      'egress denied by rule',
    );
    // The header too: curl shows a refused CONNECT's headers (-v) but never its body.
    return endRaw(
      client,
      403,
      'Forbidden',
      [`${EGRESS_POLICY_HEADER}: ${decision.rule}`],
      `${EGRESS_REFUSAL}: ${decision.rule}\n`,
    );
  }
  // The upstream connects to the address that was checked, so a name cannot resolve elsewhere later.
  const checked = decision.address.includes(':')
    ? `[${decision.address}]:${target.port}`
    : `${decision.address}:${target.port}`;
  /** Whether the client already has its 200: a refusal can then only close the connection. */
  let answered = false;
  const refuse = (status: number, reason: string, headers: string[], body?: string) => {
    if (answered) client.destroy();
    else endRaw(client, status, reason, headers, body);
  };
  if (inspector?.applies(target.host, routing)) {
    const opening = clientOpening(client, head);
    // The host's certificate is made while the client answers the 200, not after its first bytes.
    inspector.prepare(target.host);
    const first = await opening;
    if (first === undefined) {
      done('client_gone');
      span.end();
      return;
    }
    if (opensTls(first)) {
      // Each request inside is counted and traced on its own (gateway/exchange).
      done('ok');
      span.setAttribute('gateway.inspected', true);
      span.end();
      return inspector.take(client, first, { host: target.host, port: target.port, checked, routing });
    }
    // Not TLS (`ws://`, a server that speaks first): a tunnel, untouched, like an excluded host.
    span.setAttribute('gateway.inspected', false);
    answered = true;
    head = first;
  }
  for (let attempt = 1; attempt <= 2; attempt++) {
    if (client.destroyed) {
      done('client_gone');
      span.end();
      return;
    }
    const got = await ctx.chooser.acquire(target.host, routing);
    if (!got.ok) {
      done('no_upstream');
      span.end();
      return refuse(
        got.status,
        got.status === 503 ? 'Service Unavailable' : 'Bad Request',
        [],
        `${got.message}\n`,
      );
    }
    const a = got.acquired;
    const up = a.upstream;
    const dialed = await dialTunnel(up, checked, ctx.limits.upstreamTimeoutMs);
    const named = [`${EGRESS_PROXY_HEADER}: ${up.key}`];
    if (dialed.ok) {
      span.setAttribute('gateway.upstream', up.key);
      return splice(ctx, a, client, dialed, head, answered, span, done);
    }
    if (dialed.kind === 'answered') {
      ctx.chooser.release(a);
      done('ok', up.key);
      span.end();
      return refuse(dialed.status, dialed.reason || 'Upstream Refused', named);
    }
    ctx.log.info({ upstream: up.key, why: dialed.why, attempt }, 'upstream failed a tunnel; reported failed');
    ctx.chooser.report(a, 'failed');
    ctx.metrics.reports.inc({ upstream: up.key, result: 'failed' });
    ctx.chooser.release(a);
    if (attempt === 2) {
      done('failed', up.key);
      span.end();
      return refuse(502, 'Bad Gateway', named, 'upstream proxy failed twice\n');
    }
  }
}

/**
 * The tunnel is up: answer the client (unless it was `answered` already), then bytes flow both
 * ways until either side ends.
 */
function splice(
  ctx: GatewayContext,
  a: Acquired,
  client: net.Socket,
  dialed: { socket: net.Socket; rest: Buffer; reader: UpstreamReader },
  head: Buffer,
  answered: boolean,
  span: Span,
  done: (result: GatewayResult, upstream?: string) => void,
): void {
  const key = a.upstream.key;
  const upstream = dialed.socket;
  const rest = dialed.rest;
  if (client.destroyed) {
    // The client gave up while the tunnel was being set up: its close event has already passed.
    upstream.destroy();
    ctx.chooser.release(a);
    done('client_gone', key);
    span.end();
    return;
  }
  if (!answered)
    client.write(`HTTP/1.1 200 Connection Established\r\n${EGRESS_PROXY_HEADER}: ${key}\r\n\r\n`);
  if (rest.length > 0) client.write(rest);
  if (head.length > 0) upstream.write(head);
  joinBothWays(ctx, a, client, upstream, {
    kind: 'connect',
    farToClient: () => dialed.reader.pipeTo(client),
    onClosed: () => {
      done('ok', key);
      span.end();
    },
  });
}
