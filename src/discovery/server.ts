/**
 * discovery/server — the HTTP face of the lease store (see docs/api.md): Fastify routes from the
 * shared route table, bearer auth, precise 400s, one server span per request, request metrics.
 * Request bodies are never logged: grants carry proxy credentials.
 */
import { createHash, timingSafeEqual } from 'node:crypto';
import type { AddressInfo } from 'node:net';
import { TypeBoxValidatorCompiler } from '@fastify/type-provider-typebox';
import {
  type Context,
  context,
  defaultTextMapGetter,
  ROOT_CONTEXT,
  type Span,
  SpanKind,
  SpanStatusCode,
  type Tracer,
  trace,
} from '@opentelemetry/api';
import { W3CTraceContextPropagator } from '@opentelemetry/core';
import Fastify, {
  type FastifyError,
  type FastifyReply,
  type FastifyRequest,
  type FastifySchemaCompiler,
  type FastifySchemaValidationError,
} from 'fastify';
import type { Logger } from 'pino';
import { Counter, type Registry } from 'prom-client';
import type { Static, TSchema } from 'typebox';
import { LeaseInputError, type LeaseStore, type NoneLeasableCounts } from '../lease/store.ts';
import { silentLogger } from '../log/index.ts';
import { parseBindAddress } from '../metrics/bind.ts';
import { buildOpenApi } from './openapi.ts';
import {
  type LeaseIdParams,
  type LeaseRequestBody,
  type ProxyListQuery,
  type RenewRequestBody,
  type ReportRequestBody,
  ROUTES,
} from './schemas.ts';

declare module 'fastify' {
  interface FastifyRequest {
    otel?: { span: Span; ctx: Context; start: number };
  }
}

export const BODY_LIMIT_BYTES = 16 * 1024;

/** Routes served without the bearer token (liveness and the built-in probe target). */
const PUBLIC_ROUTES = new Set(ROUTES.filter((r) => !r.auth).map((r) => r.url));

export interface DiscoveryServerOptions {
  /** `host:port`; `:8090` listens on all interfaces, port 0 picks a free one. */
  bindAddress: string;
  leases: LeaseStore;
  /**
   * Bearer token (DISCOVERY_TOKEN), surrounding whitespace ignored. Without it the API is open and
   * says so at startup; an empty or blank token is refused (fail fast, never silently open).
   */
  token?: string;
  log?: Logger;
  registry: Registry;
  tracer?: Tracer;
}

export interface DiscoveryServer {
  /** Base URL, e.g. `http://127.0.0.1:41234`. */
  url: string;
  close(): Promise<void>;
}

/** A 400 that names the request field at fault. */
export class FieldError extends Error {
  readonly field: string;
  readonly statusCode = 400;
  constructor(field: string, message: string) {
    super(message);
    this.name = 'FieldError';
    this.field = field;
  }
}

/** The discovery API's listen address: `:port` means every IPv4 interface; it cannot be disabled. */
export function discoveryBindAddress(bind: string): { host: string; port: number } {
  const parsed = parseBindAddress(bind, 'discovery bind address');
  if (!parsed)
    throw new Error(
      `discovery bind address "${bind}" must be host:port; the discovery API cannot be disabled`,
    );
  return { host: parsed.host ?? '0.0.0.0', port: parsed.port };
}

function fieldOf(part: string, path: string): string {
  return path === '' ? part : path.slice(1).replaceAll('/', '.');
}

/** Turns TypeBox's error list into one message about one field, the most specific first. */
export function toFieldError(part: string, errors: FastifySchemaValidationError[]): FieldError {
  type E = FastifySchemaValidationError & { keyword: string; params: Record<string, unknown> };
  const list = errors as E[];
  const extra = list.find((e) => e.keyword === 'additionalProperties');
  if (extra) {
    const names = (extra.params.additionalProperties as string[] | undefined) ?? [];
    const name = names[0] ?? '?';
    const at = fieldOf(part, extra.instancePath);
    const field = at === part ? name : `${at}.${name}`;
    return new FieldError(field, `unknown field "${field}" in ${part}`);
  }
  const required = list.find((e) => e.keyword === 'required');
  if (required) {
    const name = ((required.params.requiredProperties as string[] | undefined) ?? [])[0] ?? '?';
    return new FieldError(name, `${name} is required`);
  }
  const anyOf = list.find((e) => e.keyword === 'anyOf');
  if (anyOf) {
    const allowed = list
      .filter((e) => e.keyword === 'const' && e.instancePath === anyOf.instancePath)
      .map((e) => String(e.params.allowedValue));
    const field = fieldOf(part, anyOf.instancePath);
    if (allowed.length > 0) return new FieldError(field, `${field} must be one of ${allowed.join(', ')}`);
    return new FieldError(field, `${field} has an invalid value`);
  }
  const first = list[0];
  if (!first) return new FieldError(part, `${part} is invalid`);
  const field = fieldOf(part, first.instancePath);
  return new FieldError(field, `${field} ${first.message}`);
}

const validatorCompiler: FastifySchemaCompiler<TSchema> = (route) => {
  const inner = TypeBoxValidatorCompiler(route);
  const part = route.httpPart === 'querystring' ? 'query' : (route.httpPart ?? 'request');
  return (value: unknown) => {
    // A POST without a body means "all defaults", not "body must be object".
    const input = route.httpPart === 'body' && (value === null || value === undefined) ? {} : value;
    const out = inner(input) as { value?: unknown; error?: FastifySchemaValidationError[] };
    if (out.error) return { error: toFieldError(part, out.error) };
    return { value: out.value };
  };
};

function errorBody(code: string, message: string, field?: string) {
  return { error: field === undefined ? { code, message } : { code, message, field } };
}

function describeRefusal(c: NoneLeasableCounts, target: string | undefined): string {
  return (
    `no proxy is leasable: ${c.matching} matching, ${c.ready} ready, ${c.healthy} healthy; of those ` +
    `${c.draining} draining, ${c.coolingDown} cooling down, ${c.coolingDownForTarget} cooling down for ` +
    `${target ? `"${target}"` : 'the target'}, ${c.atCapacity} at capacity`
  );
}

function hash(s: string): Buffer {
  return createHash('sha256').update(s).digest();
}

export async function startDiscoveryServer(opts: DiscoveryServerOptions): Promise<DiscoveryServer> {
  const { leases, registry } = opts;
  const log = opts.log ?? silentLogger();
  const tracer = opts.tracer ?? trace.getTracer('egress-proxies-operator/discovery');
  const propagator = new W3CTraceContextPropagator();
  const { host, port } = discoveryBindAddress(opts.bindAddress);
  // Trimmed: a token mounted from a file-created Secret often ends in a newline.
  const token = opts.token?.trim();
  if (token === '') {
    throw new Error('discovery token is empty; unset DISCOVERY_TOKEN to run without authentication');
  }
  const tokenHash = token ? hash(token) : undefined;

  const leaseRequests = new Counter({
    name: 'proxy_operator_lease_requests_total',
    help: 'POST /v1/leases requests by result (granted, none_leasable, bad_request, unauthorized, error).',
    labelNames: ['result'],
    registers: [registry],
  });
  const requests = new Counter({
    name: 'proxy_operator_discovery_requests_total',
    help: 'Discovery API requests by method, route pattern and status code.',
    labelNames: ['method', 'route', 'code'],
    registers: [registry],
  });

  const app = Fastify({ logger: false, bodyLimit: BODY_LIMIT_BYTES, return503OnClosing: true });
  app.setValidatorCompiler(validatorCompiler);

  // Only JSON bodies; anything else is 415. Empty JSON body = no body.
  app.removeAllContentTypeParsers();
  app.addContentTypeParser('application/json', { parseAs: 'string' }, (_req, body, done) => {
    const text = body as string;
    if (text.trim() === '') return done(null, undefined);
    try {
      done(null, JSON.parse(text));
    } catch (err) {
      done(new FieldError('body', `body is not valid JSON: ${(err as Error).message}`), undefined);
    }
  });

  app.addHook('onRequest', (req, reply, done) => {
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
    req.otel = { span, ctx: trace.setSpan(parent, span), start: performance.now() };
    if (!tokenHash || (route !== undefined && PUBLIC_ROUTES.has(route))) return done();
    const header = req.headers.authorization;
    const given = header && /^bearer\s+/i.test(header) ? header.replace(/^bearer\s+/i, '').trim() : undefined;
    if (given !== undefined && timingSafeEqual(hash(given), tokenHash)) return done();
    reply
      .code(401)
      .header('www-authenticate', 'Bearer')
      .send(errorBody('unauthorized', given === undefined ? 'bearer token required' : 'wrong bearer token'));
  });

  app.addHook('onResponse', (req, reply, done) => {
    const route = req.routeOptions.url ?? 'unmatched';
    const status = reply.statusCode;
    requests.inc({ method: req.method, route, code: String(status) });
    if (route === '/v1/leases' && req.method === 'POST') {
      const result =
        status === 201
          ? 'granted'
          : status === 409
            ? 'none_leasable'
            : status === 401
              ? 'unauthorized'
              : status >= 500
                ? 'error'
                : 'bad_request';
      leaseRequests.inc({ result });
    }
    const otel = req.otel;
    if (otel) {
      otel.span.setAttribute('http.response.status_code', status);
      if (status >= 500) otel.span.setStatus({ code: SpanStatusCode.ERROR });
      otel.span.end();
      if (status >= 500 || log.isLevelEnabled('debug')) {
        const fields = { method: req.method, route, status, ms: Math.round(performance.now() - otel.start) };
        context.with(otel.ctx, () =>
          status >= 500
            ? log.error(fields, 'discovery request failed')
            : log.debug(fields, 'discovery request'),
        );
      }
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

  app.setErrorHandler((err: FastifyError | FieldError | LeaseInputError, req, reply) => {
    if (err instanceof FieldError || err instanceof LeaseInputError) {
      return reply.code(400).send(errorBody('bad_request', err.message, err.field));
    }
    const code = (err as FastifyError).code;
    if (code === 'FST_ERR_CTP_INVALID_MEDIA_TYPE') {
      return reply
        .code(415)
        .send(errorBody('unsupported_media_type', 'content type must be application/json'));
    }
    if (code === 'FST_ERR_CTP_BODY_TOO_LARGE') {
      return reply
        .code(413)
        .send(errorBody('payload_too_large', `body larger than ${BODY_LIMIT_BYTES} bytes`));
    }
    const status = (err as FastifyError).statusCode ?? 500;
    if (status >= 400 && status < 500) return reply.code(status).send(errorBody('bad_request', err.message));
    req.otel?.span.recordException({ name: err.name, message: err.message });
    log.error({ err: { name: err.name, message: err.message, stack: err.stack } }, 'discovery handler error');
    return reply.code(500).send(errorBody('internal', 'internal error'));
  });

  app.setNotFoundHandler((req, reply) => {
    reply.code(404).send(errorBody('not_found', `no route ${req.method} ${req.url.split('?')[0]}`));
  });

  const within = <T>(req: FastifyRequest, fn: () => T): T =>
    req.otel ? context.with(req.otel.ctx, fn) : fn();

  const handlers: Record<string, (req: FastifyRequest, reply: FastifyReply) => unknown> = {
    healthz: (_req, reply) => reply.send({ status: 'ok' }),
    probeTarget: (_req, reply) => reply.code(204).send(),
    listProxies: (req, reply) =>
      within(req, () => {
        const q = req.query as Static<typeof ProxyListQuery>;
        const proxies = leases.snapshot({ namespace: q.namespace, selector: q.selector, target: q.target });
        return reply.header('cache-control', 'no-store').send({ proxies });
      }),
    lease: (req, reply) =>
      within(req, () => {
        const body = req.body as Static<typeof LeaseRequestBody>;
        const out = leases.lease(body);
        reply.header('cache-control', 'no-store');
        if (out.granted) {
          req.otel?.span.setAttribute('lease.proxy', `${out.grant.proxy.namespace}/${out.grant.proxy.name}`);
          return reply.code(201).send(out.grant);
        }
        return reply.code(409).send({
          ...errorBody('none_leasable', describeRefusal(out.counts, body.target)),
          ...out.counts,
        });
      }),
    renew: (req, reply) =>
      within(req, () => {
        const { id } = req.params as Static<typeof LeaseIdParams>;
        const body = req.body as Static<typeof RenewRequestBody>;
        const out = leases.renew(id, body.ttlSeconds);
        if (!out) return reply.code(404).send(errorBody('not_found', 'lease not found or expired'));
        return reply.send(out);
      }),
    release: (req, reply) =>
      within(req, () => {
        leases.release((req.params as Static<typeof LeaseIdParams>).id);
        return reply.code(204).send();
      }),
    report: (req, reply) =>
      within(req, () => {
        const { id } = req.params as Static<typeof LeaseIdParams>;
        const body = req.body as Static<typeof ReportRequestBody>;
        if (!leases.report(id, body))
          return reply.code(404).send(errorBody('not_found', 'lease not found or expired'));
        return reply.send({ id, released: body.release !== false });
      }),
  };

  for (const def of ROUTES) {
    const handler = handlers[def.operationId];
    if (!handler) throw new Error(`no handler for ${def.operationId}`);
    const response: Record<number, TSchema> = {};
    for (const [status, schema] of Object.entries(def.schema.response))
      if (schema) response[Number(status)] = schema;
    app.route({
      method: def.method,
      url: def.url,
      schema: {
        ...(def.schema.querystring ? { querystring: def.schema.querystring } : {}),
        ...(def.schema.params ? { params: def.schema.params } : {}),
        ...(def.schema.body ? { body: def.schema.body } : {}),
        response,
      },
      handler,
    });
  }
  const openapi = JSON.stringify(buildOpenApi());
  app.get('/openapi.json', (_req, reply) => reply.type('application/json').send(openapi));

  await app.listen({ host, port });
  const addr = app.server.address() as AddressInfo;
  const shown = addr.family === 'IPv6' ? `[${addr.address}]` : addr.address;
  const url = `http://${shown === '0.0.0.0' ? '127.0.0.1' : shown === '[::]' ? '[::1]' : shown}:${addr.port}`;
  if (!tokenHash) {
    log.warn(
      { address: url },
      'DISCOVERY API IS UNAUTHENTICATED: DISCOVERY_TOKEN is not set, so anyone who can reach this port can lease proxies and read their credentials',
    );
  } else {
    log.info({ address: url }, 'discovery API listening (bearer token required)');
  }
  return {
    url,
    close: () => app.close(),
  };
}
