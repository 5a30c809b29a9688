/**
 * dashboard/routes — the handlers of the dashboard's routes in the API's table
 * (discovery/schemas): the page and its files answer anyone (they hold no data), the data under
 * `/v1/dashboard/` needs the API's bearer token and, on a standby, is forwarded to the leader
 * like every `/v1/` request.
 */
import type { FastifyReply } from 'fastify';
import { errorBody } from '../discovery/errors.ts';
import type { Handlers } from '../discovery/schemas.ts';
import type { DashboardAssets } from './assets.ts';
import type { Dashboard } from './dashboard.ts';

/**
 * Only this origin's scripts, styles and requests; nothing inline, no framing. The page builds
 * its DOM from text nodes, so this is a second line, not the only one.
 */
const PAGE_CSP =
  "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

function hardened<R extends FastifyReply>(reply: R): R {
  reply
    .header('content-security-policy', PAGE_CSP)
    .header('x-content-type-options', 'nosniff')
    .header('referrer-policy', 'no-referrer')
    .header('x-frame-options', 'DENY');
  return reply;
}

type DashboardOperation = 'dashboardPage' | 'dashboardFile' | 'dashboardState' | 'dashboardHistory';

export function dashboardHandlers(
  dashboard: Dashboard,
  assets: DashboardAssets,
): Pick<Handlers, DashboardOperation> {
  return {
    dashboardPage: (_req, reply) =>
      hardened(reply).type('text/html; charset=utf-8').header('cache-control', 'no-cache').send(assets.page),
    dashboardFile: (req, reply) => {
      const asset = assets.files.get(req.params.file);
      if (!asset) return reply.code(404).send(errorBody('not_found', 'no such dashboard file'));
      return hardened(reply).type(asset.contentType).header('cache-control', 'no-cache').send(asset.body);
    },
    // JSON text the dashboard caches across viewers: sent as it is, not serialised again.
    dashboardState: (req, reply) =>
      reply
        .type('application/json; charset=utf-8')
        .header('cache-control', 'no-store')
        .send(
          dashboard.stateJson(req.query.after ?? 0, {
            since: req.query.since,
            from: req.query.from,
            limit: req.query.limit,
          }),
        ),
    dashboardHistory: (req, reply) =>
      reply
        .type('application/json; charset=utf-8')
        .header('cache-control', 'no-store')
        .send(dashboard.historyJsonText(req.query.proxies?.split(',').filter(Boolean))),
  };
}
