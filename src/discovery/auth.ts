/**
 * discovery/auth — the optional bearer token: refused when blank (never silently open), compared
 * in constant time, and checked on every route the table marks `auth` (discovery/schemas) and on
 * unknown paths.
 */
import type { IncomingMessage } from 'node:http';
import type { FastifyReply, FastifyRequest } from 'fastify';
import { errorBody } from './errors.ts';

/**
 * Whether `given` equals `expected`, in time that depends on the length of `expected` only: no
 * early exit at the first differing character, and a wrong length costs the same as a wrong
 * character. A plain loop instead of hashing both sides for `timingSafeEqual`: a SHA-256 per
 * request was the largest single cost of the lease API after socket writes (docs/benchmarks.md).
 */
export function sameSecret(given: string, expected: string): boolean {
  let diff = given.length ^ expected.length;
  // charCodeAt past the end of `given` is NaN, which `| 0` turns into 0: still a full pass.
  for (let i = 0; i < expected.length; i++) diff |= (given.charCodeAt(i) | 0) ^ expected.charCodeAt(i);
  return diff === 0;
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
 * The configured token as requests must present it, or undefined when the API runs open.
 * Trimmed: a token mounted from a file-created Secret often ends in a newline.
 */
export function expectedToken(token: string | undefined): string | undefined {
  const trimmed = token?.trim();
  if (trimmed === '') {
    throw new Error('discovery token is empty; unset DISCOVERY_TOKEN to run without authentication');
  }
  return trimmed || undefined;
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

/**
 * Whether a request would pass the token check: what decides, for a client that sent
 * `Expect: 100-continue`, whether it is invited to send its body (discovery/server).
 */
export function bearerAdmits(token: string): (req: IncomingMessage) => boolean {
  return (req) => {
    const given = bearerToken(req.headers.authorization);
    return given !== undefined && sameSecret(given, token);
  };
}

/** A request hook that answers a request it refuses and lets the others through. */
export type Guard = (req: FastifyRequest, reply: FastifyReply, done: () => void) => void;

/** The guard that answers 401 to a request without the right bearer token. */
export function bearerGuard(token: string): Guard {
  const admits = bearerAdmits(token);
  return (req, reply, done) => {
    if (admits(req.raw)) return done();
    const given = bearerToken(req.headers.authorization);
    reply
      .code(401)
      .header('www-authenticate', 'Bearer')
      .send(errorBody('unauthorized', given === undefined ? 'bearer token required' : 'wrong bearer token'));
  };
}
