/**
 * discovery/public — which requests are served without the bearer token and whatever their
 * Host: the API's public routes (liveness, the probe target) and routes registered with
 * `config: { public: true }` (the dashboard's page and assets, which hold no data).
 */
import type { FastifyRequest } from 'fastify';
import { ROUTES } from './schemas.ts';

declare module 'fastify' {
  interface FastifyContextConfig {
    /** Served without the token and past the Host guard: the route must reveal nothing. */
    public?: boolean;
  }
}

const PUBLIC_ROUTES = new Set(ROUTES.filter((r) => !r.auth).map((r) => r.url));

export function isPublicRoute(req: FastifyRequest): boolean {
  const route = req.routeOptions.url;
  if (route === undefined) return false;
  return PUBLIC_ROUTES.has(route) || req.routeOptions.config?.public === true;
}
