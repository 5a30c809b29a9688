/**
 * dashboard/routes — the dashboard's HTTP routes on the discovery server: the page and its
 * assets answer anyone (they hold no data), the data under `/v1/dashboard/` needs the API's
 * bearer token and, on a standby, is forwarded to the leader like every `/v1/` request.
 */
import type { FastifyInstance, FastifyReply } from 'fastify';
import { errorBody } from '../discovery/errors.ts';
import type { DashboardAssets } from './assets.ts';
import type { Dashboard } from './dashboard.ts';

/**
 * Only this origin's scripts, styles and requests; nothing inline, no framing. The page builds
 * its DOM from text nodes, so this is a second line, not the only one.
 */
const PAGE_CSP =
  "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

function hardened(reply: FastifyReply): FastifyReply {
  return reply
    .header('content-security-policy', PAGE_CSP)
    .header('x-content-type-options', 'nosniff')
    .header('referrer-policy', 'no-referrer')
    .header('x-frame-options', 'DENY');
}

/** `?after=` of the state route: a non-negative integer, anything else reads as 0 (everything). */
function afterParam(query: unknown): number {
  const raw = (query as Record<string, unknown> | undefined)?.after;
  const n = typeof raw === 'string' && /^\d{1,15}$/.test(raw) ? Number(raw) : 0;
  return Number.isSafeInteger(n) ? n : 0;
}

export function registerDashboardRoutes(
  app: FastifyInstance,
  dashboard: Dashboard,
  assets: DashboardAssets,
): void {
  const pub = { config: { public: true } };
  app.get('/', pub, (_req, reply) =>
    hardened(reply).type('text/html; charset=utf-8').header('cache-control', 'no-cache').send(assets.page),
  );
  app.get<{ Params: { file: string } }>('/dashboard/:file', pub, (req, reply) => {
    const asset = assets.files.get(req.params.file);
    if (!asset) return reply.code(404).send(errorBody('not_found', 'no such dashboard file'));
    return hardened(reply).type(asset.contentType).header('cache-control', 'no-cache').send(asset.body);
  });
  app.get('/v1/dashboard/state', (req, reply) =>
    reply
      .type('application/json; charset=utf-8')
      .header('cache-control', 'no-store')
      .send(dashboard.stateJson(afterParam(req.query))),
  );
  app.get('/v1/dashboard/history', (_req, reply) =>
    reply
      .type('application/json; charset=utf-8')
      .header('cache-control', 'no-store')
      .send(dashboard.historyJsonText()),
  );
}
