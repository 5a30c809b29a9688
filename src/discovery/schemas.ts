/**
 * discovery/schemas — the API listener's contract, written once: the route table of every route
 * it serves (lease API, session reports, dashboard, gateway sync) with TypeBox schemas that
 * validate requests, serialise responses, type the handlers and are the source of /openapi.json.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import type {
  ContextConfigDefault,
  FastifyReply,
  FastifyRequest,
  RawServerDefault,
  RouteGenericInterface,
} from 'fastify';
import Type, { type TSchema } from 'typebox';
import { LocationSchema } from '../api/proxy.ts';
import {
  DashboardFileParams,
  DashboardHistoryQuery,
  DashboardStateBody,
  DashboardStateQuery,
  LatencyHistoryBody,
} from '../dashboard/schemas.ts';
import { SyncAnswerBody, SyncRequestBody } from '../gateway/share.ts';
import { NAMESPACE_PATTERN } from '../lease/input.ts';
import { MAX_COOLDOWN_SECONDS, MAX_TTL_SECONDS } from '../lease/types.ts';

const Ttl = Type.Integer({
  minimum: 1,
  maximum: MAX_TTL_SECONDS,
  description: `Lease lifetime in seconds (1–${MAX_TTL_SECONDS}); default 300.`,
});
const Target = Type.String({
  maxLength: 2048,
  description:
    'Site the proxy will be used for: a host, host:port or URL; normalised to the lowercase host name as a URL parser reads it (`2130706433`, `http://2130706433/` and `127.0.0.1` are one target). Cooldowns from `blocked` reports are per target.',
});
const SelectorText = Type.String({
  maxLength: 4096,
  description: 'Kubernetes label selector over Proxy labels, e.g. `pool=eu,tier!=spot`.',
});
const Namespace = Type.String({
  // The pattern bounds the length (63) too, so every refusal gets the one DNS-1123 message.
  pattern: NAMESPACE_PATTERN,
  description: 'Only proxies in this namespace: a DNS-1123 label (empty = any namespace).',
});

export const ErrorBody = Type.Object(
  {
    error: Type.Object({
      code: Type.String({ description: 'Machine-readable code, e.g. bad_request, none_leasable.' }),
      message: Type.String(),
      field: Type.Optional(Type.String({ description: 'The request field at fault (400 only).' })),
    }),
  },
  { description: 'Every error response.' },
);

export const LeaseRequestBody = Type.Object(
  {
    target: Type.Optional(Target),
    selector: Type.Optional(SelectorText),
    namespace: Type.Optional(Namespace),
    ttlSeconds: Type.Optional(Ttl),
  },
  { additionalProperties: false },
);

export const LeaseGrantBody = Type.Object({
  id: Type.String({ description: 'Opaque, unguessable lease ID.' }),
  proxy: Type.Object({
    namespace: Type.String(),
    name: Type.String(),
    url: Type.String({ description: 'http://user:password@host:port — credentials included.' }),
    host: Type.String(),
    port: Type.Integer(),
  }),
  target: Type.Union([Type.String(), Type.Null()], { description: 'Normalised target, or null.' }),
  expiresAt: Type.String({ format: 'date-time' }),
});

const count = (description: string) => Type.Integer({ minimum: 0, description });

export const NoneLeasableBody = Type.Object(
  {
    error: ErrorBody.properties.error,
    matching: count('Proxies matching namespace and selector.'),
    ready: count('…of those, phase Ready with an address and not being deleted.'),
    healthy: count('…of those, Healthy.'),
    draining: count('…of the healthy ones, draining (spec.drain).'),
    coolingDown: count('…of the healthy, non-draining ones, in a global cooldown.'),
    coolingDownForTarget: count('…of the rest, cooling down for the requested target.'),
    atCapacity: count('…of the rest, holding maxLeases leases.'),
    retryAt: Type.Union([Type.String({ format: 'date-time' }), Type.Null()], {
      description:
        'Earliest time a matching proxy may become leasable for the target (a cooldown ends, a lease at a full proxy expires); null when none will by itself (nothing matches, or only unready, unhealthy or draining proxies). The `Retry-After` header says the same in seconds (30 when null).',
    }),
  },
  { description: 'Nothing leasable: the funnel that explains why.' },
);

export const RenewRequestBody = Type.Object(
  { ttlSeconds: Type.Optional(Ttl) },
  { additionalProperties: false },
);

export const RenewResponseBody = Type.Object({
  id: Type.String(),
  expiresAt: Type.String({ format: 'date-time' }),
});

export const ReportRequestBody = Type.Object(
  {
    result: Type.Union([Type.Literal('success'), Type.Literal('blocked'), Type.Literal('failed')], {
      description:
        'blocked: the target refused this proxy (cooldown for that target); failed: the proxy itself failed (global cooldown and a re-probe).',
    }),
    cooldownSeconds: Type.Optional(
      Type.Integer({
        minimum: 1,
        maximum: MAX_COOLDOWN_SECONDS,
        description: 'Override the cooldown (blocked: default 600, failed: default 60).',
      }),
    ),
    release: Type.Optional(Type.Boolean({ description: 'Release the lease too (default true).' })),
  },
  { additionalProperties: false },
);

export const ReportResponseBody = Type.Object({
  id: Type.String(),
  released: Type.Boolean(),
});

const ProxyRef = Type.Object(
  {
    namespace: Type.String({ minLength: 1, maxLength: 63 }),
    name: Type.String({ minLength: 1, maxLength: 253 }),
  },
  {
    additionalProperties: false,
    description: 'The proxy as a grant names it (`proxy.namespace`, `proxy.name`).',
  },
);

export const ProxyReportRequestBody = Type.Object(
  {
    proxy: ProxyRef,
    target: Type.Optional(Target),
    result: ReportRequestBody.properties.result,
    cooldownSeconds: ReportRequestBody.properties.cooldownSeconds,
  },
  {
    additionalProperties: false,
    description:
      'A report about a proxy for a target, without a lease id: for a lease shared by several requests or long ended. `blocked` needs `target`.',
  },
);

export const ProxyReportResponseBody = Type.Object({
  proxy: Type.Object({ namespace: Type.String(), name: Type.String() }),
  target: Type.Union([Type.String(), Type.Null()], { description: 'Normalised target, or null.' }),
  result: Type.String(),
});

const Nullable = <T extends TSchema>(t: T) => Type.Union([t, Type.Null()]);

export const ProxyStatusBody = Type.Object({
  namespace: Type.String(),
  name: Type.String(),
  phase: Type.String(),
  healthy: Type.Boolean(),
  draining: Type.Boolean(),
  deleting: Type.Boolean(),
  host: Nullable(Type.String()),
  port: Nullable(Type.Integer()),
  egressIP: Nullable(
    Type.String({
      description:
        'The source address its traffic leaves from (status.egressIP), null when unknown. Proxies sharing one share blocked cooldowns.',
    }),
  ),
  location: Type.Optional(
    Type.Object(LocationSchema.properties, {
      additionalProperties: false,
      description:
        'Where it runs (status.location), present when its provider reports it: selectors match it as topology.kubernetes.io/region and topology.kubernetes.io/zone.',
    }),
  ),
  latencyMillis: Nullable(Type.Number()),
  activeLeases: Type.Integer(),
  maxLeases: Type.Integer({ description: '0 = unlimited.' }),
  lastLeasedAt: Nullable(Type.String({ format: 'date-time' })),
  cooldownUntil: Nullable(Type.String({ format: 'date-time', description: 'End of a global cooldown.' })),
  targetCooldowns: Type.Array(
    Type.Object({ target: Type.String(), until: Type.String({ format: 'date-time' }) }),
  ),
  leasable: Type.Boolean({ description: 'Would be granted now (for the given target, if any).' }),
  reason: Nullable(
    Type.String({
      description:
        'Why not leasable: NotReady, Deleting, Unhealthy, Draining, CoolingDown, CoolingDownForTarget, AtCapacity.',
    }),
  ),
  problem: Nullable(
    Type.Object(
      {
        reason: Type.String({ description: 'CredentialsError or CloudInitError.' }),
        message: Type.String({ description: 'What is wrong, e.g. which Secret is missing.' }),
      },
      {
        description:
          'A problem the operator cannot fix by itself (its Provisioned condition), so the proxy stays unserved or unchanged until someone acts; null otherwise.',
      },
    ),
  ),
  drainingInstances: Type.Optional(
    Type.Array(
      Type.Object({
        host: Type.String(),
        port: Type.Integer(),
        since: Type.String({ format: 'date-time', description: 'When it stopped getting new leases.' }),
        activeLeases: Type.Integer({ description: 'Leases granted on it that are still live.' }),
      }),
      {
        description:
          'Replaced instances of this proxy that drain: they keep serving the leases granted on them, get no new ones, and are deleted once those end (at the latest --drain-timeout after the switch). Present only while one drains.',
      },
    ),
  ),
});

export const ProxyListBody = Type.Object({
  proxies: Type.Array(ProxyStatusBody),
  continue: Type.Optional(
    Type.String({
      description:
        'Present when `limit` cut the list: pass it as `continue` for the next page (opaque; the proxy the page ended on).',
    }),
  ),
});

/** The largest page `GET /v1/proxies?limit=` serves. */
export const MAX_PROXY_PAGE = 10_000;

export const ProxyListQuery = Type.Object(
  {
    selector: Type.Optional(SelectorText),
    namespace: Type.Optional(Namespace),
    target: Type.Optional(Target),
    limit: Type.Optional(
      Type.Integer({
        minimum: 1,
        maximum: MAX_PROXY_PAGE,
        description: 'At most this many proxies; the answer says `continue` when more follow (default: all).',
      }),
    ),
    continue: Type.Optional(
      Type.String({
        maxLength: 512,
        pattern: '^[^/]+/[^/]+$',
        description: "The previous page's `continue`: this page starts after it.",
      }),
    ),
  },
  { additionalProperties: false },
);

export const LeaseIdParams = Type.Object({
  id: Type.String({ minLength: 1, maxLength: 128, description: 'Lease ID from the grant.' }),
});

export const SessionIdParams = Type.Object({
  id: Type.String({
    pattern: '^[A-Za-z0-9_.]{1,63}$',
    description: 'Sticky session id: the `session-<id>` option of the gateway user name (docs/gateway.md).',
  }),
});

export const SessionReportRequestBody = Type.Object(
  {
    result: Type.Union([Type.Literal('success'), Type.Literal('blocked'), Type.Literal('failed')], {
      description:
        "blocked: the target refused the session's upstream (cooldown for that target); failed: the upstream itself failed (global cooldown). Either way the session moves to another upstream.",
    }),
    target: Type.Optional(Target),
  },
  { additionalProperties: false },
);

export const SessionReportResponseBody = Type.Object({
  id: Type.String(),
  upstream: Type.String({ description: '`namespace/name` of the upstream the report concerned.' }),
  target: Type.String(),
});

export const HealthBody = Type.Object({ status: Type.Literal('ok') });

/** Names under which schemas appear in components.schemas of the OpenAPI document. */
export const NAMED_SCHEMAS: Record<string, TSchema> = {
  Error: ErrorBody,
  LeaseRequest: LeaseRequestBody,
  LeaseGrant: LeaseGrantBody,
  NoneLeasable: NoneLeasableBody,
  RenewRequest: RenewRequestBody,
  RenewResponse: RenewResponseBody,
  ReportRequest: ReportRequestBody,
  ReportResponse: ReportResponseBody,
  ProxyReportRequest: ProxyReportRequestBody,
  ProxyReportResponse: ProxyReportResponseBody,
  ProxyStatus: ProxyStatusBody,
  ProxyList: ProxyListBody,
  Health: HealthBody,
  SessionReportRequest: SessionReportRequestBody,
  SessionReportResponse: SessionReportResponseBody,
  DashboardState: DashboardStateBody,
  LatencyHistory: LatencyHistoryBody,
  SyncRequest: SyncRequestBody,
  SyncAnswer: SyncAnswerBody,
};

export interface RouteSchema {
  querystring?: TSchema;
  params?: TSchema;
  body?: TSchema;
  /** By status; null = no body. */
  response: Record<number, TSchema | null>;
}

export interface RouteDef<S extends RouteSchema = RouteSchema, T extends boolean = boolean> {
  method: 'GET' | 'POST' | 'DELETE';
  /** Fastify pattern (`:id`). */
  url: string;
  summary: string;
  /** Needs the bearer token (or, without one, an admitted Host); false only for routes that reveal nothing. */
  auth: boolean;
  /** Human descriptions per status code (OpenAPI). */
  statuses: Record<number, string>;
  /** The content type of the 200 answer when it is not JSON (the dashboard's page and files). */
  contentType?: string;
  /**
   * The handler answers 200 with JSON text it built and cached itself (the dashboard's data,
   * one serialisation for any number of viewers): the 200 schema documents it, nothing
   * serialises it again.
   */
  jsonText?: T;
  schema: S;
}

/** A route's handler, its request and reply typed from the route's schemas. */
export type RouteHandler<S extends RouteSchema> = (
  req: FastifyRequest<RouteGenericInterface, RawServerDefault, IncomingMessage, S, TypeBoxTypeProvider>,
  reply: FastifyReply<
    RouteGenericInterface,
    RawServerDefault,
    IncomingMessage,
    ServerResponse,
    ContextConfigDefault,
    S,
    TypeBoxTypeProvider
  >,
) => unknown;

const common = {
  401: 'Missing or wrong bearer token.',
  400: 'Malformed request (a field out of its schema, a body that is not JSON or gives a key twice); `error.field` names the field.',
};

/** Refusals a route can meet by its shape alone (see the loop after the table). */
const byShape = {
  400: common[400],
  413: 'Body larger than 16 KiB.',
  415: 'Content type is not application/json, or its charset is not UTF-8.',
  431: 'Request line and headers larger than the server reads (a long query string).',
};

/** Keeps each route's own schema types, so its handler is typed by them. */
const route = <S extends RouteSchema, T extends boolean = false>(def: RouteDef<S, T>): RouteDef<S, T> => def;

/** Every route of the API listener, by operation id. */
export const ROUTES = {
  healthz: route({
    method: 'GET',
    url: '/healthz',
    summary: 'Liveness. Never authenticated.',
    auth: false,
    statuses: { 200: 'Alive.' },
    schema: { response: { 200: HealthBody } },
  }),
  probeTarget: route({
    method: 'GET',
    url: '/generate_204',
    summary:
      'Always 204, never authenticated: a health-check target served by the operator itself, so proxies on loopback or a private network can be probed without internet access.',
    auth: false,
    statuses: { 204: 'No content.' },
    schema: { response: { 204: null } },
  }),
  openapi: route({
    method: 'GET',
    url: '/openapi.json',
    summary: 'This document.',
    auth: true,
    statuses: { 200: 'OpenAPI 3.1 document.', 401: common[401] },
    schema: { response: { 200: null, 401: ErrorBody } },
  }),
  listProxies: route({
    method: 'GET',
    url: '/v1/proxies',
    summary:
      'Proxies with phase, health, latency, leases, cooldowns and whether leasable now. No credentials.',
    auth: true,
    statuses: {
      200: 'The proxies, sorted by namespace and name (one page of them with `limit`).',
      ...common,
    },
    schema: { querystring: ProxyListQuery, response: { 200: ProxyListBody, 400: ErrorBody, 401: ErrorBody } },
  }),
  lease: route({
    method: 'POST',
    url: '/v1/leases',
    summary: 'Lease the best leasable proxy.',
    auth: true,
    statuses: {
      201: 'Granted.',
      409: 'Nothing leasable; the body explains why and `retryAt` says when to ask again (also as `Retry-After`).',
      ...common,
    },
    schema: {
      body: LeaseRequestBody,
      response: {
        201: LeaseGrantBody,
        409: NoneLeasableBody,
        400: ErrorBody,
        401: ErrorBody,
        413: ErrorBody,
        415: ErrorBody,
      },
    },
  }),
  renew: route({
    method: 'POST',
    url: '/v1/leases/:id/renew',
    summary: 'Extend a live lease to now + ttlSeconds.',
    auth: true,
    statuses: { 200: 'Renewed.', 404: 'Unknown or expired lease.', ...common },
    schema: {
      params: LeaseIdParams,
      body: RenewRequestBody,
      response: { 200: RenewResponseBody, 404: ErrorBody, 400: ErrorBody, 401: ErrorBody },
    },
  }),
  release: route({
    method: 'DELETE',
    url: '/v1/leases/:id',
    summary: 'Release a lease. Idempotent: unknown and expired leases also answer 204.',
    auth: true,
    statuses: { 204: 'Released (or already gone).', 401: common[401] },
    schema: { params: LeaseIdParams, response: { 204: null, 401: ErrorBody } },
  }),
  report: route({
    method: 'POST',
    url: '/v1/leases/:id/report',
    summary:
      'Report how the proxy did; blocked/failed start cooldowns. Releases the lease unless release=false.',
    auth: true,
    statuses: { 200: 'Recorded.', 404: 'Unknown or expired lease.', ...common },
    schema: {
      params: LeaseIdParams,
      body: ReportRequestBody,
      response: { 200: ReportResponseBody, 404: ErrorBody, 400: ErrorBody, 401: ErrorBody },
    },
  }),
  reportProxy: route({
    method: 'POST',
    url: '/v1/reports',
    summary:
      'Report how a proxy did for a target, by proxy instead of lease id; nothing is released. Idempotent: cooldowns only lengthen.',
    auth: true,
    statuses: { 200: 'Recorded.', 404: 'No such proxy.', ...common },
    schema: {
      body: ProxyReportRequestBody,
      response: { 200: ProxyReportResponseBody, 404: ErrorBody, 400: ErrorBody, 401: ErrorBody },
    },
  }),
  reportSession: route({
    method: 'POST',
    url: '/v1/sessions/:id/report',
    summary:
      "Report how a gateway sticky session's upstream did for a target (default: the host it used last); blocked/failed cool the upstream down and move the session.",
    auth: true,
    statuses: {
      200: 'Recorded.',
      404: 'Unknown or idle session, or it never used that target.',
      409: 'The gateway does not run in the process that decides leases.',
      ...common,
    },
    schema: {
      params: SessionIdParams,
      body: SessionReportRequestBody,
      response: {
        200: SessionReportResponseBody,
        404: ErrorBody,
        409: ErrorBody,
        400: ErrorBody,
        401: ErrorBody,
      },
    },
  }),
  gatewayCa: route({
    method: 'GET',
    url: '/v1/gateway/ca.pem',
    summary:
      'The gateway\'s inspection CA certificate (PEM), for clients to trust (docs/gateway.md, "HTTPS inspection"). Public like any CA certificate, so never authenticated; the key is never served.',
    auth: false,
    contentType: 'application/x-pem-file',
    statuses: {
      200: 'The CA certificate.',
      404: 'HTTPS inspection is off (`--gateway-inspect`), or the gateway does not run in this process.',
    },
    schema: { response: { 200: null, 404: ErrorBody } },
  }),
  dashboardPage: route({
    method: 'GET',
    url: '/',
    summary: 'The dashboard page (docs/dashboard.md). Holds no data, so never authenticated.',
    auth: false,
    contentType: 'text/html; charset=utf-8',
    statuses: { 200: 'The page.' },
    schema: { response: { 200: null } },
  }),
  dashboardFile: route({
    method: 'GET',
    url: '/dashboard/:file',
    summary: "The page's scripts and stylesheet. Never authenticated.",
    auth: false,
    contentType: 'text/javascript; charset=utf-8',
    statuses: { 200: 'The file (JavaScript, or CSS for `app.css`).', 404: 'No such file.' },
    schema: { params: DashboardFileParams, response: { 200: null, 404: ErrorBody } },
  }),
  dashboardState: route({
    method: 'GET',
    url: '/v1/dashboard/state',
    summary:
      'The fleet as the dashboard shows it (no credentials): the rows changed after `since` (or the fleet in pages), and the events after `after`.',
    auth: true,
    jsonText: true,
    statuses: { 200: 'The fleet now.', ...common },
    schema: {
      querystring: DashboardStateQuery,
      response: { 200: DashboardStateBody, 400: ErrorBody, 401: ErrorBody },
    },
  }),
  dashboardHistory: route({
    method: 'GET',
    url: '/v1/dashboard/history',
    summary: 'Mean probe latency per proxy per step, for the dashboard.',
    auth: true,
    jsonText: true,
    statuses: { 200: 'The history.', ...common },
    schema: {
      querystring: DashboardHistoryQuery,
      response: { 200: LatencyHistoryBody, 400: ErrorBody, 401: ErrorBody },
    },
  }),
  gatewaySync: route({
    method: 'POST',
    url: '/v1/internal/gateway/sync',
    summary:
      "A gateway replica's sync with the leader's hub (docs/gateway.md): its share of each upstream's capacity, reports, and the cooldowns it has not seen. Internal: gateway replicas call it.",
    auth: true,
    statuses: {
      200: 'The hub’s answer (at most `waitMs` later when a watch has no news).',
      404: "Not served here: this process's gateway does not run in cluster mode.",
      ...common,
    },
    schema: {
      body: SyncRequestBody,
      response: { 200: SyncAnswerBody, 404: ErrorBody, 400: ErrorBody, 401: ErrorBody },
    },
  }),
};

export type OperationId = keyof typeof ROUTES;

/** The schemas Fastify validates and serialises a route with: a JSON-text answer is sent as it is. */
type Served<D> =
  D extends RouteDef<infer S, infer T>
    ? T extends true
      ? Omit<S, 'response'> & { response: Omit<S['response'], 200> & { 200: null } }
      : S
    : never;

/** The handler of every route, each typed by its route's schemas. */
export type Handlers = { [K in OperationId]: RouteHandler<Served<(typeof ROUTES)[K]>> };

/** Adds a refusal to a route's statuses and responses unless it declares that status itself. */
function declare(def: RouteDef, status: keyof typeof byShape): void {
  def.statuses[status] ??= byShape[status];
  def.schema.response[status] ??= ErrorBody;
}

// What any route can meet by its shape, declared once here so no route's list misses one:
// anything with a parameter, query or body a 400; a body 413 and 415; a query string that can
// outgrow the request head (a selector of 4096 characters, percent-encoded) 431.
for (const def of Object.values(ROUTES) as RouteDef[]) {
  const { params, querystring, body } = def.schema;
  if (params || querystring || body) declare(def, 400);
  if (body) {
    declare(def, 413);
    declare(def, 415);
  }
  if (querystring) declare(def, 431);
}

// Every /v1 route can meet a replica without a leader; a grant can also meet the lease cap.
for (const [operationId, def] of Object.entries(ROUTES) as [OperationId, RouteDef][]) {
  if (!def.url.startsWith('/v1/')) continue;
  def.statuses[503] =
    operationId === 'lease'
      ? '`no_leader`: no replica decides leases right now (retry after `Retry-After`); `too_many_leases`: the operator holds --max-active-leases leases.'
      : '`no_leader`: no replica decides leases right now; retry after `Retry-After` (1 s).';
  def.schema.response[503] = ErrorBody;
}
