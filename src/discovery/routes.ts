/**
 * discovery/routes — the handlers behind the shared route table (see docs/api.md): each one maps
 * a validated request onto one LeaseStore call and its answer onto a status and body.
 */
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { Static, TSchema } from 'typebox';
import type { GatewaySessions } from '../gateway/service.ts';
import type { LeaseStore } from '../lease/store.ts';
import { normalizeTarget } from '../lease/target.ts';
import type { LeaseOutcome, NoneLeasableCounts } from '../lease/types.ts';
import { errorBody } from './errors.ts';
import { buildOpenApi } from './openapi.ts';
import {
  type LeaseIdParams,
  type LeaseRequestBody,
  type ProxyListQuery,
  type ProxyReportRequestBody,
  type RenewRequestBody,
  type ReportRequestBody,
  ROUTES,
  type SessionIdParams,
  type SessionReportRequestBody,
} from './schemas.ts';
import { withinRequest as within } from './telemetry.ts';

type Handler = (req: FastifyRequest, reply: FastifyReply) => unknown;

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

function handlers(leases: LeaseStore, sessions: GatewaySessions | undefined): Record<string, Handler> {
  return {
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
        const refusal = noneLeasable(out, body.target, leases.now());
        return reply.code(409).header('retry-after', refusal.retryAfter).send(refusal.body);
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
    reportProxy: (req, reply) =>
      within(req, () => {
        const body = req.body as Static<typeof ProxyReportRequestBody>;
        const { proxy, ...rest } = body;
        if (!leases.reportProxy({ ...proxy, ...rest }))
          return reply.code(404).send(errorBody('not_found', 'no such proxy'));
        return reply.send({ proxy, target: normalizeTarget(body.target) ?? null, result: body.result });
      }),
    reportSession: (req, reply) =>
      within(req, async () => {
        const { id } = req.params as Static<typeof SessionIdParams>;
        const body = req.body as Static<typeof SessionReportRequestBody>;
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
  };
}

/** Registers every route of the table (each must have a handler) and /openapi.json. */
export function registerRoutes(app: FastifyInstance, leases: LeaseStore, sessions?: GatewaySessions): void {
  const byOperation = handlers(leases, sessions);
  for (const def of ROUTES) {
    const handler = byOperation[def.operationId];
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
}
