/**
 * Kubernetes client plumbing: Status parsing and StoreError mapping for client-node errors,
 * per-call cancellation and request timeouts through the shared agent.
 */
import { ApiException } from '@kubernetes/client-node';
import { afterEach, describe, expect, it } from 'vitest';
import { callOptions, createKubeClients, type KubeClients } from '../../../src/runtime/kube/client.ts';
import { parseStatus, reasonFor, statusCodeOf, toStoreError } from '../../../src/runtime/kube/errors.ts';
import { isConflict, isNotFound, type StoreError } from '../../../src/runtime/store.ts';
import { type KubeServer, startKubeServer } from '../../support/kube-server/index.ts';

const status = (code: number, reason: string, message: string) =>
  JSON.stringify({ kind: 'Status', apiVersion: 'v1', status: 'Failure', code, reason, message });

describe('kube errors', () => {
  it('parses the raw-string Status body of an ApiException', () => {
    expect(parseStatus(status(409, 'Conflict', 'the object has been modified'))?.reason).toBe('Conflict');
    expect(parseStatus('not json')).toBeUndefined();
    expect(parseStatus(undefined)).toBeUndefined();
    expect(parseStatus({ kind: 'Status', reason: 'NotFound' })?.reason).toBe('NotFound');
  });

  it('maps HTTP codes and Status reasons to StoreError reasons', () => {
    expect(reasonFor(404)).toBe('NotFound');
    expect(reasonFor(409, 'AlreadyExists')).toBe('AlreadyExists');
    expect(reasonFor(409, 'Conflict')).toBe('Conflict');
    expect(reasonFor(410)).toBe('Gone');
    expect(reasonFor(422)).toBe('Invalid');
    expect(reasonFor(403)).toBe('Forbidden');
    expect(reasonFor(415)).toBe('BadRequest');
    expect(reasonFor(429)).toBe('Unavailable');
    expect(reasonFor(503)).toBe('Unavailable');
  });

  it('turns ApiExceptions and watch errors into StoreErrors, leaves transport errors alone', () => {
    const api = new ApiException(409, 'x', status(409, 'Conflict', 'the object has been modified'), {});
    const e = toStoreError(api, 'patch proxies ns/a') as StoreError;
    expect(isConflict(e)).toBe(true);
    expect(e.code).toBe(409);
    expect(e.message).toBe('patch proxies ns/a: Conflict (HTTP 409): the object has been modified');
    expect(e.cause).toBe(api);
    const watchErr = Object.assign(new Error('Gone'), { statusCode: 410 });
    expect((toStoreError(watchErr, 'watch') as StoreError).reason).toBe('Gone');
    expect(statusCodeOf(watchErr)).toBe(410);
    const net = new TypeError('fetch failed');
    expect(toStoreError(net, 'get')).toBe(net);
    expect(isNotFound(toStoreError(new ApiException(404, 'x', '', {}), 'get'))).toBe(true);
  });
});

describe('kube client', () => {
  let server: KubeServer | undefined;
  let clients: KubeClients | undefined;
  afterEach(async () => {
    await clients?.close();
    await server?.stop();
    server = undefined;
    clients = undefined;
  });

  const get = (c: KubeClients, opts?: Parameters<typeof callOptions>[0]) =>
    c.customObjects.getNamespacedCustomObject(
      { group: 'crawl.example.com', version: 'v1alpha1', plural: 'proxies', namespace: 'ns', name: 'x' },
      callOptions(opts),
    );

  it('a caller signal cancels a slow request', async () => {
    server = await startKubeServer();
    clients = await createKubeClients(server.kubeConfig());
    server.injectFault({ path: /\/proxies\/x$/, delayMs: 2000 });
    const ac = new AbortController();
    const t0 = Date.now();
    const p = get(clients, { signal: ac.signal });
    setTimeout(() => ac.abort(), 100);
    await expect(p).rejects.toThrow();
    expect(Date.now() - t0).toBeLessThan(1500);
  });

  it('every request is bounded by the configured timeout', async () => {
    server = await startKubeServer();
    clients = await createKubeClients(server.kubeConfig(), { requestTimeoutMs: 200 });
    server.injectFault({ path: /\/proxies\/x$/, delayMs: 3000 });
    const t0 = Date.now();
    await expect(get(clients)).rejects.toThrow();
    expect(Date.now() - t0).toBeLessThan(2000);
  });

  it('sends the bearer token and reports a missing cluster precisely', async () => {
    server = await startKubeServer();
    clients = await createKubeClients(server.kubeConfig());
    await get(clients).catch(() => {});
    expect(server.requests.at(-1)?.authorization).toBe('Bearer test-token');
    const { KubeConfig } = await import('@kubernetes/client-node');
    await expect(createKubeClients(new KubeConfig())).rejects.toThrow(/no current cluster/);
  });
});
