/**
 * discovery/telemetry — what each request leaves behind: one server span (continuing the
 * caller's W3C trace context), the request counters, and a log line for failures (every request
 * at debug). Request bodies are never logged: grants carry proxy credentials.
 */
import {
  type Context,
  context,
  defaultTextMapGetter,
  INVALID_TRACEID,
  ROOT_CONTEXT,
  type Span,
  SpanKind,
  SpanStatusCode,
  type Tracer,
  trace,
} from '@opentelemetry/api';
import { W3CTraceContextPropagator } from '@opentelemetry/core';
import type { FastifyInstance, FastifyRequest } from 'fastify';
import type { Logger } from 'pino';
import type { Registry } from 'prom-client';
import { type CounterCell, counter, counterCells } from '../metrics/register.ts';

declare module 'fastify' {
  interface FastifyRequest {
    otel?: { span: Span; ctx: Context };
  }
}

/** Runs `fn` inside the request's span context, so logs and child spans join its trace. */
export function withinRequest<T>(req: FastifyRequest, fn: () => T): T {
  return req.otel ? context.with(req.otel.ctx, fn) : fn();
}

/** The `result` label of a POST /v1/leases by its status code. */
export function leaseResult(status: number): string {
  if (status === 201) return 'granted';
  if (status === 409) return 'none_leasable';
  if (status === 401) return 'unauthorized';
  if (status >= 500) return 'error';
  return 'bad_request';
}

/** Counter cells by route, method and status code: three map lookups, no key built per request. */
function cellTable(
  make: (route: string, method: string, code: number) => CounterCell,
): (route: string, method: string, code: number) => CounterCell {
  // Routes and methods are a fixed set, status codes a handful: the table stays small.
  const byRoute = new Map<string, Map<string, Map<number, CounterCell>>>();
  return (route, method, code) => {
    let byMethod = byRoute.get(route);
    if (!byMethod) {
      byMethod = new Map();
      byRoute.set(route, byMethod);
    }
    let byCode = byMethod.get(method);
    if (!byCode) {
      byCode = new Map();
      byMethod.set(method, byCode);
    }
    let cell = byCode.get(code);
    if (!cell) {
      cell = make(route, method, code);
      byCode.set(code, cell);
    }
    return cell;
  };
}

/**
 * Whether `tracer` records spans: the API's no-op tracer (tracing off) answers with an invalid
 * trace id. The probe span is never ended, so a real tracer exports nothing for it.
 */
function recordsSpans(tracer: Tracer): boolean {
  return tracer.startSpan('probe').spanContext().traceId !== INVALID_TRACEID;
}

/**
 * Installs the span, metric and log hooks. Must be installed before auth, so a refused request
 * is traced and counted too. With tracing off there are no span hooks at all: tracing is set up
 * before any server starts (cmd/compose).
 */
export function installTelemetry(
  app: FastifyInstance,
  { registry, tracer, log }: { registry: Registry; tracer: Tracer; log: Logger },
): void {
  const leaseRequests = counter(registry, {
    name: 'proxy_operator_lease_requests_total',
    help: 'POST /v1/leases requests by result (granted, none_leasable, bad_request, unauthorized, error).',
    labelNames: ['result'],
  });
  const requests = counter(registry, {
    name: 'proxy_operator_discovery_requests_total',
    help: 'Discovery API requests by method, route pattern and status code.',
    labelNames: ['method', 'route', 'code'],
  });

  const requestCell = counterCells(requests, ['method', 'route', 'code']);
  const requestsBy = cellTable((route, method, code) => requestCell(method, route, String(code)));
  const leaseCell = counterCells(leaseRequests, ['result']);
  const leaseCells = new Map<number, CounterCell>();
  const leaseRequestsBy = (code: number): CounterCell => {
    let cell = leaseCells.get(code);
    if (!cell) {
      cell = leaseCell(leaseResult(code));
      leaseCells.set(code, cell);
    }
    return cell;
  };

  const countResponse = (route: string, method: string, status: number): void => {
    requestsBy(route, method, status).inc();
    if (route === '/v1/leases' && method === 'POST') leaseRequestsBy(status).inc();
  };

  // Counted as the answer is sent (onSend), not once it is written (onResponse): listening for
  // every response's 'finish' costs more than the rest of the telemetry together.
  app.addHook('onSend', (req, reply, payload, done) => {
    const route = req.routeOptions.url ?? 'unmatched';
    const status = reply.statusCode;
    countResponse(route, req.method, status);
    if (status >= 500 || log.isLevelEnabled('debug')) {
      const fields = { method: req.method, route, status };
      const write = () =>
        status >= 500
          ? log.error(fields, 'discovery request failed')
          : log.debug(fields, 'discovery request');
      if (req.otel) context.with(req.otel.ctx, write);
      else write();
    }
    done(null, payload);
  });
  if (recordsSpans(tracer)) installSpans(app, tracer, new W3CTraceContextPropagator());
}

/**
 * One server span per request, continuing the caller's W3C trace context. A sampler that drops
 * spans still yields valid ids, and callers' trace context keeps flowing through them.
 */
function installSpans(app: FastifyInstance, tracer: Tracer, propagator: W3CTraceContextPropagator): void {
  app.addHook('onRequest', (req, _reply, done) => {
    const route = req.routeOptions.url;
    const parent = propagator.extract(ROOT_CONTEXT, req.headers, defaultTextMapGetter);
    const span = tracer.startSpan(
      route ? `HTTP ${req.method} ${route}` : `HTTP ${req.method}`,
      {
        kind: SpanKind.SERVER,
        attributes: { 'http.request.method': req.method, ...(route ? { 'http.route': route } : {}) },
      },
      parent,
    );
    req.otel = { span, ctx: trace.setSpan(parent, span) };
    done();
  });

  app.addHook('onResponse', (req, reply, done) => {
    const otel = req.otel;
    if (otel) {
      const status = reply.statusCode;
      otel.span.setAttribute('http.response.status_code', status);
      if (status >= 500) otel.span.setStatus({ code: SpanStatusCode.ERROR });
      otel.span.end();
    }
    done();
  });

  // A client that hangs up early gets no onResponse; end its span anyway.
  app.addHook('onRequestAbort', (req, done) => {
    req.otel?.span.setAttribute('http.request.aborted', true);
    req.otel?.span.end();
    req.otel = undefined;
    done();
  });
}
