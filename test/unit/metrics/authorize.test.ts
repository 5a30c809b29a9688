import { createServer, type IncomingMessage, type Server } from 'node:http';
import { KubeConfig } from '@kubernetes/client-node';
import { Gauge, Registry } from 'prom-client';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import {
  closeServer,
  listenOn,
  type MetricsServer,
  startMetricsServer,
  tokenReviewAuthorizer,
} from '../../../src/metrics/index.ts';
import { FakeClock } from '../../support/clock.ts';

/**
 * A tiny stand-in for the two review endpoints of kube-apiserver: it answers TokenReview and
 * SubjectAccessReview the way the real one does (echoing the object with a status), from a
 * table of known tokens and an RBAC rule "prometheus may get /metrics".
 */
interface Reviews {
  tokenReviews: number;
  accessReviews: number;
  lastAccessSpec?: Record<string, unknown>;
  operatorAuth: Array<string | undefined>;
  failNext: boolean;
}

const USERS: Record<string, { username: string; uid: string; groups: string[] }> = {
  'prom-token': {
    username: 'system:serviceaccount:monitoring:prometheus',
    uid: 'u-prom',
    groups: ['system:serviceaccounts'],
  },
  'alice-token': { username: 'alice', uid: 'u-alice', groups: ['system:authenticated'] },
};

function readJson(req: IncomingMessage): Promise<Record<string, unknown>> {
  return new Promise((resolve, reject) => {
    let data = '';
    req.on('data', (c: Buffer) => {
      data += c.toString();
    });
    req.on('end', () => resolve(JSON.parse(data) as Record<string, unknown>));
    req.on('error', reject);
  });
}

function fakeApiserver(state: Reviews): Server {
  return createServer(async (req, res) => {
    state.operatorAuth.push(req.headers.authorization);
    const body = await readJson(req);
    const reply = (status: number, obj: unknown): void => {
      res.writeHead(status, { 'content-type': 'application/json' });
      res.end(JSON.stringify(obj));
    };
    if (state.failNext) {
      state.failNext = false;
      return reply(500, {
        kind: 'Status',
        apiVersion: 'v1',
        status: 'Failure',
        code: 500,
        message: 'etcd down',
      });
    }
    const spec = (body.spec ?? {}) as Record<string, unknown>;
    if (req.method === 'POST' && req.url?.startsWith('/apis/authentication.k8s.io/v1/tokenreviews')) {
      state.tokenReviews++;
      const user = USERS[spec.token as string];
      return reply(201, {
        ...body,
        status: user
          ? { authenticated: true, user, audiences: ['https://kubernetes.default.svc'] }
          : { authenticated: false },
      });
    }
    if (req.method === 'POST' && req.url?.startsWith('/apis/authorization.k8s.io/v1/subjectaccessreviews')) {
      state.accessReviews++;
      state.lastAccessSpec = spec;
      const nr = spec.nonResourceAttributes as { path?: string; verb?: string } | undefined;
      const allowed =
        spec.user === 'system:serviceaccount:monitoring:prometheus' &&
        nr?.path === '/metrics' &&
        nr.verb === 'get';
      return reply(201, {
        ...body,
        status: allowed ? { allowed: true, reason: 'RBAC: allowed' } : { allowed: false },
      });
    }
    reply(404, { kind: 'Status', code: 404 });
  });
}

describe('tokenReviewAuthorizer behind the metrics server', () => {
  const state: Reviews = { tokenReviews: 0, accessReviews: 0, operatorAuth: [], failNext: false };
  let apiserver: Server;
  let kc: KubeConfig;
  let clock: FakeClock;
  let metrics: MetricsServer;
  let url: string;

  beforeAll(async () => {
    apiserver = fakeApiserver(state);
    const { port } = await listenOn(apiserver, { host: '127.0.0.1', port: 0 });
    kc = new KubeConfig();
    kc.loadFromOptions({
      clusters: [{ name: 'c', server: `http://127.0.0.1:${port}`, skipTLSVerify: true }],
      users: [{ name: 'operator', token: 'operator-sa-token' }],
      contexts: [{ name: 'ctx', cluster: 'c', user: 'operator' }],
      currentContext: 'ctx',
    });
  });

  beforeEach(async () => {
    await metrics?.close();
    Object.assign(state, { tokenReviews: 0, accessReviews: 0, operatorAuth: [], failNext: false });
    clock = new FakeClock();
    const registry = new Registry();
    new Gauge({ name: 'proxy_operator_up', help: 'up', registers: [registry] }).set(1);
    const s = await startMetricsServer({
      bindAddress: '127.0.0.1:0',
      registry,
      authorize: tokenReviewAuthorizer(kc, { clock }),
    });
    metrics = s!;
    url = `http://127.0.0.1:${metrics.port}/metrics`;
  });

  afterAll(async () => {
    await metrics?.close();
    await closeServer(apiserver);
  });

  const scrape = (token?: string): Promise<Response> =>
    fetch(url, token ? { headers: { authorization: `Bearer ${token}` } } : {});

  it('lets an authorised ServiceAccount scrape, as the operator, asking about get /metrics', async () => {
    const res = await scrape('prom-token');
    expect(res.status).toBe(200);
    expect(await res.text()).toContain('proxy_operator_up');
    expect(state.lastAccessSpec).toMatchObject({
      user: 'system:serviceaccount:monitoring:prometheus',
      uid: 'u-prom',
      groups: ['system:serviceaccounts'],
      nonResourceAttributes: { path: '/metrics', verb: 'get' },
    });
    // The reviews are made with the operator's own credentials, never the scraper's.
    expect(state.operatorAuth.every((h) => h === 'Bearer operator-sa-token')).toBe(true);
  });

  it('answers 401 without or with an unknown token and 403 when RBAC says no', async () => {
    expect((await scrape()).status).toBe(401);
    expect(state.tokenReviews).toBe(0);
    expect((await scrape('forged')).status).toBe(401);
    expect(state.accessReviews).toBe(0);
    expect((await scrape('alice-token')).status).toBe(403);
    expect(state.accessReviews).toBe(1);
  });

  it('reuses a verdict for a minute, then asks again', async () => {
    for (let i = 0; i < 3; i++) expect((await scrape('prom-token')).status).toBe(200);
    expect((await scrape('alice-token')).status).toBe(403);
    expect((await scrape('alice-token')).status).toBe(403);
    expect(state.tokenReviews).toBe(2);
    clock.advance(61_000);
    expect((await scrape('prom-token')).status).toBe(200);
    expect(state.tokenReviews).toBe(3);
  });

  it('shares one review among concurrent scrapes with the same token', async () => {
    const results = await Promise.all(Array.from({ length: 5 }, () => scrape('prom-token')));
    expect(results.map((r) => r.status)).toEqual([200, 200, 200, 200, 200]);
    expect(state.tokenReviews).toBe(1);
  });

  it('denies while the apiserver fails, without caching the failure', async () => {
    state.failNext = true;
    expect((await scrape('prom-token')).status).toBe(403);
    expect((await scrape('prom-token')).status).toBe(200);
  });
});
