/**
 * discovery/auth — the optional bearer token: refused when blank (never silently open), compared
 * in constant time, and not required on the public routes (liveness and the probe target).
 */
import { hash as oneShotHash, timingSafeEqual } from 'node:crypto';
import type { FastifyInstance } from 'fastify';
import { errorBody } from './errors.ts';
import { isPublicRoute } from './public.ts';

function hash(s: string): Buffer {
  return oneShotHash('sha256', s, 'buffer');
}

/** The token of an `Authorization: Bearer <token>` header (scheme case-insensitive), if any. */
function bearerToken(header: string | undefined): string | undefined {
  if (header === undefined || header.length < 7) return undefined;
  const scheme = header.slice(0, 6);
  if (scheme !== 'Bearer' && scheme.toLowerCase() !== 'bearer') return undefined;
  const rest = header.slice(6);
  // The scheme must be followed by whitespace: "Bearerabc" carries no bearer token.
  if (rest.trimStart().length === rest.length) return undefined;
  return rest.trim();
}

/**
 * The hash of the configured token, or undefined when the API runs open. Trimmed: a token
 * mounted from a file-created Secret often ends in a newline.
 */
export function tokenDigest(token: string | undefined): Buffer | undefined {
  const trimmed = token?.trim();
  if (trimmed === '') {
    throw new Error('discovery token is empty; unset DISCOVERY_TOKEN to run without authentication');
  }
  return trimmed ? hash(trimmed) : undefined;
}

/**
 * The token from the environment: undefined only when DISCOVERY_TOKEN is not set at all.
 * Surrounding whitespace is trimmed (a Secret created from a file usually ends in a newline);
 * a value that is empty or only whitespace is an error naming the variable, because treating it
 * as "unset" would serve credentials to anyone.
 */
export function discoveryTokenFromEnv(env: NodeJS.ProcessEnv): string | undefined {
  const raw = env.DISCOVERY_TOKEN;
  if (raw === undefined) return undefined;
  const token = raw.trim();
  if (token === '') {
    throw new Error(
      `DISCOVERY_TOKEN is set but ${raw === '' ? 'empty' : 'blank (whitespace only)'}: set a real token, or unset the variable to run the discovery API without authentication`,
    );
  }
  return token;
}

/** Answers 401 to a request on a non-public route without the right bearer token. */
export function installBearerAuth(app: FastifyInstance, tokenHash: Buffer): void {
  app.addHook('onRequest', (req, reply, done) => {
    if (isPublicRoute(req)) return done();
    const given = bearerToken(req.headers.authorization);
    if (given !== undefined && timingSafeEqual(hash(given), tokenHash)) return done();
    reply
      .code(401)
      .header('www-authenticate', 'Bearer')
      .send(errorBody('unauthorized', given === undefined ? 'bearer token required' : 'wrong bearer token'));
  });
}
