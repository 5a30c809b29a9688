/**
 * The gateway's per-upstream series (docs/operations.md, catalogue): after tunnels and plain-HTTP
 * requests through two upstreams, each upstream's requests, bytes both ways and reports count
 * its own traffic only, refusals before any upstream carry `upstream=""`, and nothing is left
 * counted as open.
 */
import type { Registry } from 'prom-client';
import { afterEach, describe, expect, it } from 'vitest';
import {
  basic,
  type LocalWorld,
  openTunnel,
  rawClient,
  startLocalWorld,
} from '../../support/gateway/local-world.ts';
import { until } from '../../support/wait.ts';

let w: LocalWorld | undefined;
afterEach(async () => {
  await w?.close();
  w = undefined;
});

/** `name`'s series as `label=value,…` → value (labels in the metric's own order). */
async function series(registry: Registry, name: string): Promise<Map<string, number>> {
  const metric = registry.getSingleMetric(name);
  if (!metric) throw new Error(`no metric ${name}`);
  const out = new Map<string, number>();
  for (const v of (await metric.get()).values) {
    const key = Object.entries(v.labels)
      .map(([k, l]) => `${k}=${String(l)}`)
      .join(',');
    out.set(key, v.value);
  }
  return out;
}

/** One plain-HTTP request through the gateway, read to its end; resolves with the whole answer. */
async function request(w: LocalWorld, user: string | undefined, path: string, body = ''): Promise<string> {
  const c = await rawClient(w.gateway.port);
  const target = `127.0.0.1:${w.httpPort}`;
  c.write(
    `POST http://${target}${path} HTTP/1.1\r\nHost: ${target}\r\n` +
      (user === undefined ? '' : `Proxy-Authorization: ${basic(user)}\r\n`) +
      `Content-Length: ${body.length}\r\nConnection: close\r\n\r\n${body}`,
  );
  await c.closed;
  return c.received();
}

/** A tunnel through `pool` that sends `bytes` bytes and reads them back, then closes. */
async function tunnelTraffic(w: LocalWorld, pool: string, bytes: number): Promise<void> {
  const t = await openTunnel(w, pool);
  const head = t.received().length;
  t.write(Buffer.alloc(bytes, 'x'));
  await until(`${bytes} bytes echoed`, () => t.received().length - head >= bytes);
  t.socket.end();
  await t.closed;
}

describe('gateway metrics per upstream', () => {
  it('counts requests, bytes and reports for each upstream apart', async () => {
    w = await startLocalWorld();
    const world = w;
    await tunnelTraffic(world, 'p1', 1000);
    await tunnelTraffic(world, 'p2', 20_000);
    expect(await request(world, 'crawler-pool-p1', '/up', 'y'.repeat(500))).toMatch(/^HTTP\/1\.1 200 /);
    expect(await request(world, 'crawler-pool-p2', '/status/429')).toMatch(/^HTTP\/1\.1 429 /);
    expect(await request(world, undefined, '/up')).toMatch(/^HTTP\/1\.1 407 /);

    await until('every connection to be let go', () => world.gateway.openConnections === 0);
    const requests = await series(world.registry, 'proxy_operator_gateway_requests_total');
    expect(Object.fromEntries(requests)).toEqual({
      'kind=connect,upstream=crawl/up1,result=ok': 1,
      'kind=connect,upstream=crawl/up2,result=ok': 1,
      'kind=http,upstream=crawl/up1,result=ok': 1,
      'kind=http,upstream=crawl/up2,result=blocked': 1,
      'kind=http,upstream=,result=unauthorized': 1,
    });

    const bytes = await series(world.registry, 'proxy_operator_gateway_bytes_total');
    // Tunnels count every byte on the upstream connection (their CONNECT exchange too, a few
    // hundred bytes); plain requests count the bodies. Each upstream holds only its own traffic.
    const up1Sent = bytes.get('upstream=crawl/up1,direction=sent') ?? 0;
    const up1Received = bytes.get('upstream=crawl/up1,direction=received') ?? 0;
    const up2Sent = bytes.get('upstream=crawl/up2,direction=sent') ?? 0;
    const up2Received = bytes.get('upstream=crawl/up2,direction=received') ?? 0;
    expect(up1Sent).toBeGreaterThanOrEqual(1000 + 500);
    expect(up1Sent).toBeLessThan(1000 + 500 + 2000);
    expect(up1Received).toBeGreaterThanOrEqual(1000 + 'got 500 bytes'.length);
    expect(up1Received).toBeLessThan(1000 + 2000);
    expect(up2Sent).toBeGreaterThanOrEqual(20_000);
    expect(up2Sent).toBeLessThan(20_000 + 2000);
    expect(up2Received).toBeGreaterThanOrEqual(20_000 + 'got 0 bytes'.length);
    expect(up2Received).toBeLessThan(20_000 + 2000);

    const reports = await series(world.registry, 'proxy_operator_gateway_upstream_reports_total');
    expect(Object.fromEntries(reports)).toEqual({ 'upstream=crawl/up2,result=blocked': 1 });

    const open = await series(world.registry, 'proxy_operator_gateway_open');
    expect([...open.values()].every((v) => v === 0)).toBe(true);
  });
});
