/**
 * discovery/routes — the lease API's handlers (see docs/lease-api.md), each mapping a validated request
 * onto one LeaseStore call and its answer onto a status and body, and the registration of every
 * route of the table (discovery/schemas) with its schemas and its auth guard.
 */
import type { FastifyInstance, RouteHandlerMethod } from 'fastify';
import type { TSchema } from 'typebox';
import type { GatewaySessions } from '../gateway/service.ts';
import type { LeaseStore } from '../lease/store.ts';
import { normalizeTarget } from '../lease/target.ts';
import type { LeaseOutcome, NoneLeasableCounts } from '../lease/types.ts';
import type { Guard } from './auth.ts';
import { errorBody } from './errors.ts';
import { buildOpenApi } from './openapi.ts';
import { type Handlers, type OperationId, ROUTES, type RouteDef } from './schemas.ts';
import { withinRequest as within } from './telemetry.ts';

/** The routes every API listener serves; the dashboard's and the gateway sync come with them. */
export type ApiOperation = Exclude<
  OperationId,
  'dashboardPage' | 'dashboardFile' | 'dashboardState' | 'dashboardHistory' | 'gatewaySync'
>;

/** The 409 message: how many proxies fell at each step, so a crawler can tell why. */
function describeRefusal(c: NoneLeasableCounts, target: string | undefined): string {
  return (
    `no proxy is leasable: ${c.matching} matching, ${c.ready} ready, ${c.healthy} healthy; of those ` +
    `${c.draining} draining, ${c.coolingDown} cooling down, ${c.coolingDownForTarget} cooling down for ` +
    `${target ? `"${target}"` : 'the target'}, ${c.atCapacity} at capacity`
  );
}

/** Retry-After without a retryAt: nothing ends by itself, but health and the fleet change. */
export const POLL_AFTER_SECONDS = 30;

/** Whole seconds until `retryAt` (at least 1), or the polling hint when there is none. */
export function retryAfterSeconds(retryAt: number | undefined, now: number): number {
  if (retryAt === undefined) return POLL_AFTER_SECONDS;
  return Math.max(1, Math.ceil((retryAt - now) / 1000));
}

/** The 409 answer to a refused grant: Retry-After and the body that explains the refusal. */
export function noneLeasable(
  out: Extract<LeaseOutcome, { granted: false }>,
  requestedTarget: string | undefined,
  now: number,
) {
  return {
    retryAfter: String(retryAfterSeconds(out.retryAt, now)),
    body: {
      ...errorBody('none_leasable', describeRefusal(out.counts, normalizeTarget(requestedTarget))),
      ...out.counts,
      retryAt: out.retryAt === undefined ? null : new Date(out.retryAt).toISOString(),
    },
  };
}

/** The lease API's handlers. */
export function apiHandlers(
  leases: LeaseStore,
  sessions: GatewaySessions | undefined,
): Pick<Handlers, ApiOperation> {
  const openapi = JSON.stringify(buildOpenApi());
  return {
    healthz: (_req, reply) => reply.send({ status: 'ok' }),
    probeTarget: (_req, reply) => reply.code(204).send(),
    openapi: (_req, reply) => reply.type('application/json').send(openapi),
    listProxies: (req, reply) =>
      within(req, () => {
        const q = req.query;
        const page = leases.snapshotPage(
          { namespace: q.namespace, selector: q.selector, target: q.target },
          { limit: q.limit, after: q.continue },
        );
        return reply.header('cache-control', 'no-store').send(page);
      }),
    lease: (req, reply) =>
      within(req, () => {
        const body = req.body;
        const out = leases.lease(body);
        reply.header('cache-control', 'no-store');
        if (out.granted) {
          req.otel?.span.setAttribute('lease.proxy', `${out.grant.proxy.namespace}/${out.grant.proxy.name}`);
          return reply.code(201).send(out.grant);
        }
        const refusal = noneLeasable(out, body.target, leases.now());
        return reply.code(409).header('retry-after', refusal.retryAfter).send(refusal.body);
      }),
    renew: (req, reply) =>
      within(req, () => {
        const out = leases.renew(req.params.id, req.body.ttlSeconds);
        if (!out) return reply.code(404).send(errorBody('not_found', 'lease not found or expired'));
        return reply.send(out);
      }),
    release: (req, reply) =>
      within(req, () => {
        leases.release(req.params.id);
        return reply.code(204).send();
      }),
    report: (req, reply) =>
      within(req, () => {
        const { id } = req.params;
        const body = req.body;
        if (!leases.report(id, body))
          return reply.code(404).send(errorBody('not_found', 'lease not found or expired'));
        return reply.send({ id, released: body.release !== false });
      }),
    reportProxy: (req, reply) =>
      within(req, () => {
        const { proxy, ...rest } = req.body;
        if (!leases.reportProxy({ ...proxy, ...rest }))
          return reply.code(404).send(errorBody('not_found', 'no such proxy'));
        return reply.send({ proxy, target: normalizeTarget(rest.target) ?? null, result: rest.result });
      }),
    reportSession: (req, reply) =>
      within(req, async () => {
        const { id } = req.params;
        const body = req.body;
        const out = sessions
          ? await sessions.report(id, body.result, body.target)
          : ({ ok: false, status: 409, message: 'the gateway is not running in this process' } as const);
        if (!out.ok) {
          return reply
            .code(out.status)
            .send(errorBody(out.status === 404 ? 'not_found' : 'conflict', out.message));
        }
        return reply.send({ id, upstream: out.upstream, target: out.target });
      }),
    gatewayCa: (_req, reply) => {
      const pem = sessions?.caCertificate;
      if (pem === undefined) {
        return reply
          .code(404)
          .send(
            errorBody('not_found', 'HTTPS inspection is off here (--gateway-inspect), so there is no CA'),
          );
      }
      return reply.type('application/x-pem-file').header('cache-control', 'no-cache').send(pem);
    },
  };
}

/**
 * Registers every route of the table that has a handler here (the dashboard's and the gateway
 * sync exist only where those run), each with its schemas and, unless it is public, `guard`.
 */
export function registerRoutes(app: FastifyInstance, handlers: Partial<Handlers>, guard: Guard): void {
  for (const [operationId, def] of Object.entries(ROUTES) as [OperationId, RouteDef][]) {
    const handler = handlers[operationId];
    if (!handler) continue;
    const response: Record<number, TSchema> = {};
    for (const [status, schema] of Object.entries(def.schema.response))
      if (schema && !(def.jsonText && status === '200')) response[Number(status)] = schema;
    app.route({
      method: def.method,
      url: def.url,
      schema: {
        ...(def.schema.querystring ? { querystring: def.schema.querystring } : {}),
        ...(def.schema.params ? { params: def.schema.params } : {}),
        ...(def.schema.body ? { body: def.schema.body } : {}),
        response,
      },
      ...(def.auth ? { onRequest: guard } : {}),
      handler: handler as RouteHandlerMethod,
    });
  }
}
