import { createServer } from 'node:http';
import { describe, expect, it } from 'vitest';
import { closeServer, listenOn, parseBindAddress } from '../../../src/metrics/index.ts';

describe('parseBindAddress', () => {
  const flag = '--metrics-bind-address';

  it('reads the forms the flags accept', () => {
    expect(parseBindAddress('0', flag)).toBeNull();
    expect(parseBindAddress(':8080', flag)).toEqual({ host: undefined, port: 8080 });
    expect(parseBindAddress('127.0.0.1:9090', flag)).toEqual({ host: '127.0.0.1', port: 9090 });
    expect(parseBindAddress('127.0.0.1:0', flag)).toEqual({ host: '127.0.0.1', port: 0 });
    expect(parseBindAddress('[::1]:8090', flag)).toEqual({ host: '::1', port: 8090 });
    expect(parseBindAddress('localhost:8081', flag)).toEqual({ host: 'localhost', port: 8081 });
    expect(parseBindAddress(' :8090 ', flag)).toEqual({ host: undefined, port: 8090 });
  });

  it.each([
    ['', 'is empty'],
    ['8080', 'has no port'],
    [':http', 'has no valid port'],
    [':65536', 'above 65535'],
    [':-1', 'has no valid port'],
    ['::1:8080', 'needs brackets'],
    ['[::1]8080', 'malformed'],
    ['[nope]:80', 'invalid IPv6'],
    ['bad_host:80', 'invalid host'],
  ])('rejects %j naming the flag', (value, why) => {
    expect(() => parseBindAddress(value, '--discovery-bind-address')).toThrow(
      new RegExp(`^--discovery-bind-address: .*${why}`),
    );
  });
});

describe('listenOn / closeServer', () => {
  it('binds an ephemeral loopback port and closes despite a kept-alive connection', async () => {
    const server = createServer((_req, res) => res.end('hi'));
    const bound = await listenOn(server, { host: '127.0.0.1', port: 0 });
    expect(bound.host).toBe('127.0.0.1');
    expect(bound.port).toBeGreaterThan(0);
    const res = await fetch(`http://127.0.0.1:${bound.port}/`); // undici keeps the socket alive
    expect(await res.text()).toBe('hi');
    const started = Date.now();
    await closeServer(server);
    expect(Date.now() - started).toBeLessThan(2_000);
    expect(server.listening).toBe(false);
  });

  it('rejects when the port is taken', async () => {
    const first = createServer();
    const { port } = await listenOn(first, { host: '127.0.0.1', port: 0 });
    try {
      await expect(listenOn(createServer(), { host: '127.0.0.1', port })).rejects.toThrow(/EADDRINUSE/);
    } finally {
      await closeServer(first);
    }
  });
});
