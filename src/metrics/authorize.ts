/**
 * metrics/authorize — `--metrics-secure`: a scrape must carry a ServiceAccount bearer token that
 * the apiserver authenticates (TokenReview) and authorises for `get` on the request's
 * non-resource URL (SubjectAccessReview). Verdicts are cached briefly, keyed by a hash of the
 * token, so a scrape every few seconds costs two API calls a minute, not two per scrape.
 */
import { createHash } from 'node:crypto';
import type { IncomingMessage } from 'node:http';
import { AuthenticationV1Api, AuthorizationV1Api, type KubeConfig } from '@kubernetes/client-node';
import type { Logger } from 'pino';
import { silentLogger } from '../log/index.ts';
import { type Clock, systemClock } from '../runtime/clock.ts';

/** Why a request was refused; the server maps it to 401 (unauthenticated) or 403 (forbidden). */
export type AuthVerdict = 'allowed' | 'unauthenticated' | 'forbidden';

/** Decides whether a request may read metrics. `true`/`false` are also accepted (false = 403). */
export type Authorize = (req: IncomingMessage) => Promise<boolean | AuthVerdict>;

export interface TokenReviewAuthorizerOptions {
  log?: Logger;
  clock?: Clock;
  /** How long a verdict is reused. Default 60 s. */
  cacheTtlMs?: number;
  /** Cached tokens at most (oldest evicted). Default 1024. */
  maxCacheEntries?: number;
}

/** The bearer token of a request, or undefined. */
export function bearerToken(req: IncomingMessage): string | undefined {
  const h = req.headers.authorization;
  if (!h) return undefined;
  const m = /^Bearer\s+(\S+)\s*$/i.exec(h);
  return m?.[1];
}

/**
 * An Authorize backed by TokenReview + SubjectAccessReview through `kubeConfig` (in cluster:
 * the operator's own ServiceAccount, which needs `create` on tokenreviews and
 * subjectaccessreviews). An apiserver error denies the request and is not cached.
 */
export function tokenReviewAuthorizer(
  kubeConfig: KubeConfig,
  opts: TokenReviewAuthorizerOptions = {},
): Authorize {
  const log = opts.log ?? silentLogger();
  const clock = opts.clock ?? systemClock;
  const ttl = opts.cacheTtlMs ?? 60_000;
  const maxEntries = opts.maxCacheEntries ?? 1024;
  const authn = kubeConfig.makeApiClient(AuthenticationV1Api);
  const authz = kubeConfig.makeApiClient(AuthorizationV1Api);
  // Map keeps insertion order: the first key is the oldest entry.
  const cache = new Map<string, { verdict: AuthVerdict; expires: number }>();
  const inFlight = new Map<string, Promise<AuthVerdict>>();

  const review = async (token: string, path: string): Promise<AuthVerdict> => {
    const tr = await authn.createTokenReview({
      body: { apiVersion: 'authentication.k8s.io/v1', kind: 'TokenReview', spec: { token } },
    });
    const user = tr.status?.user;
    if (!tr.status?.authenticated || !user) return 'unauthenticated';
    const sar = await authz.createSubjectAccessReview({
      body: {
        apiVersion: 'authorization.k8s.io/v1',
        kind: 'SubjectAccessReview',
        spec: {
          user: user.username,
          uid: user.uid,
          groups: user.groups,
          extra: user.extra,
          nonResourceAttributes: { path, verb: 'get' },
        },
      },
    });
    if (sar.status?.allowed && !sar.status.denied) return 'allowed';
    log.info({ user: user.username, path }, 'metrics scrape forbidden by SubjectAccessReview');
    return 'forbidden';
  };

  return async (req) => {
    const token = bearerToken(req);
    if (!token) return 'unauthenticated';
    const path = new URL(req.url ?? '/', 'http://x').pathname;
    const key = `${createHash('sha256').update(token).digest('hex')} ${path}`;
    const now = clock.now();
    const hit = cache.get(key);
    if (hit && hit.expires > now) return hit.verdict;
    if (hit) cache.delete(key);
    let pending = inFlight.get(key);
    if (!pending) {
      pending = review(token, path)
        .then((verdict) => {
          cache.set(key, { verdict, expires: clock.now() + ttl });
          while (cache.size > maxEntries) cache.delete(cache.keys().next().value as string);
          return verdict;
        })
        .catch((err: unknown) => {
          // Never log the token; the client error may echo the request, so only its code/name.
          const code = (err as { code?: unknown } | null)?.code;
          log.warn(
            { code, error: err instanceof Error ? err.name : typeof err },
            'metrics auth review failed',
          );
          return 'forbidden' as const;
        })
        .finally(() => inFlight.delete(key));
      inFlight.set(key, pending);
    }
    return pending;
  };
}
