/**
 * What the lease API reads, and what its document promises, as schemathesis left them
 * (test/integration/discovery/openapi-fuzz.test.ts): a JSON key given twice is a 400 naming it,
 * never the last value silently; a body in a charset other than UTF-8 is a 415 naming it, bytes
 * that are not UTF-8 a 400; query values convert only when written as their type (`after=true`
 * is a 400, not 1); an over-long path parameter is named; and the OpenAPI document declares
 * every refusal a route can meet and which bodies are required.
 */
import { Registry } from 'prom-client';
import { afterEach, describe, expect, it } from 'vitest';
import { DashboardStateQuery } from '../../../src/dashboard/schemas.ts';
import { overlongParam } from '../../../src/discovery/errors.ts';
import { buildOpenApi } from '../../../src/discovery/openapi.ts';
import { type DiscoveryServer, startDiscoveryServer } from '../../../src/discovery/server.ts';
import {
  charsetOf,
  convertUrlValues,
  duplicateKey,
  parseJsonBody,
} from '../../../src/discovery/validation.ts';
import { LeaseStore } from '../../../src/lease/store.ts';
import { FakeClock } from '../../support/clock.ts';
import { proxyInfo } from '../../support/lease.ts';

const TOKEN = 'bodies-token-0123456789';
const AUTH = { authorization: `Bearer ${TOKEN}` };

const closers: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of closers.splice(0).reverse()) await c();
});

async function setup(): Promise<{ server: DiscoveryServer; leases: LeaseStore }> {
  const leases = new LeaseStore({ clock: new FakeClock(Date.now()) });
  leases.upsertProxy(proxyInfo('a', { host: '127.0.0.1', credentials: { username: 'u', password: 'p' } }));
  const server = await startDiscoveryServer({
    bindAddress: '127.0.0.1:0',
    leases,
    registry: new Registry(),
    token: TOKEN,
  });
  closers.push(
    () => leases.close(),
    () => server.close(),
  );
  return { server, leases };
}

async function post(
  server: DiscoveryServer,
  path: string,
  body: string | Uint8Array<ArrayBuffer>,
  contentType = 'application/json',
): Promise<{ status: number; error: { code: string; message: string; field?: string } }> {
  const res = await fetch(`${server.url}${path}`, {
    method: 'POST',
    headers: { ...AUTH, 'content-type': contentType },
    body,
  });
  const json = (await res.json()) as { error: { code: string; message: string; field?: string } };
  return { status: res.status, error: json.error };
}

describe('duplicate JSON keys', () => {
  it('finds the first key an object repeats, with its path, keys compared as decoded', () => {
    expect(duplicateKey('{"a":1,"b":2}')).toBeUndefined();
    expect(duplicateKey('{"a":1,"a":2}')).toEqual(['a']);
    expect(duplicateKey('{"a":1,"\\u0061":2}')).toEqual(['a']);
    expect(duplicateKey('{"p":{"x":1},"q":{"x":1}}')).toBeUndefined();
    expect(duplicateKey('{"proxy":{"name":"a","name":"b"}}')).toEqual(['proxy', 'name']);
    expect(duplicateKey('{"r":[{"t":1},{"t":1,"t":2}]}')).toEqual(['r', 1, 't']);
    // Braces, quotes and commas inside strings are text, not structure.
    expect(duplicateKey('{"a":"{\\"a\\":1,","b":"]}","c":[","]}')).toBeUndefined();
    expect(duplicateKey('[{"a":1},{"a":1}]')).toBeUndefined();
    expect(parseJsonBody('{"ttlSeconds":60,"ttlSeconds":3600}').error?.field).toBe('ttlSeconds');
  });

  it('a lease body that gives a key twice is a 400 naming it, and nothing is granted', async () => {
    const { server, leases } = await setup();
    const res = await post(server, '/v1/leases', '{"ttlSeconds":60,"target":"a.example","ttlSeconds":3600}');
    expect(res.status).toBe(400);
    expect(res.error).toMatchObject({ code: 'bad_request', field: 'ttlSeconds' });
    expect(res.error.message).toMatch(/^ttlSeconds appears more than once in body/);
    expect(leases.activeLeases()).toBe(0);
  });

  it('a nested key given twice is named by its path', async () => {
    const { server } = await setup();
    const res = await post(
      server,
      '/v1/reports',
      '{"proxy":{"namespace":"default","name":"a","name":"b"},"result":"failed"}',
    );
    expect(res.status).toBe(400);
    expect(res.error.field).toBe('proxy.name');
  });
});

describe('charsets', () => {
  it('reads the charset parameter of a content type', () => {
    expect(charsetOf('application/json')).toBeUndefined();
    expect(charsetOf('application/json; charset=UTF-8')).toBe('utf-8');
    expect(charsetOf('application/json;charset="utf-16"')).toBe('utf-16');
    expect(charsetOf(undefined)).toBeUndefined();
  });

  it('a UTF-16 body is a 415 naming the charset, not garbage read as UTF-8', async () => {
    const { server, leases } = await setup();
    const json = JSON.stringify({ target: 'a.example' });
    for (const charset of ['utf-16', 'UTF-16LE', 'iso-8859-1']) {
      const res = await post(
        server,
        '/v1/leases',
        Buffer.from(json, charset === 'iso-8859-1' ? 'latin1' : 'utf16le'),
        `application/json; charset=${charset}`,
      );
      expect(res.status, charset).toBe(415);
      expect(res.error.code).toBe('unsupported_media_type');
      expect(res.error.message).toContain(`charset "${charset.toLowerCase()}" is not supported`);
    }
    expect(leases.activeLeases()).toBe(0);
  });

  it('UTF-8 is read with or without the parameter; bytes that are not UTF-8 are a 400', async () => {
    const { server } = await setup();
    for (const type of [
      'application/json',
      'application/json; charset=utf-8',
      'application/json; charset="UTF8"',
    ]) {
      const res = await fetch(`${server.url}/v1/leases`, {
        method: 'POST',
        headers: { ...AUTH, 'content-type': type },
        body: '{"target":"bücher.example"}',
      });
      expect(res.status, type).toBe(201);
      expect(((await res.json()) as { target: string }).target).toBe('xn--bcher-kva.example');
    }
    const bad = await post(server, '/v1/leases', Buffer.from([0x7b, 0x22, 0xff, 0x22, 0x3a, 0x31, 0x7d]));
    expect(bad.status).toBe(400);
    expect(bad.error).toMatchObject({ field: 'body', message: 'body is not valid UTF-8' });
  });
});

describe('query values', () => {
  it('convert only when written as their type', () => {
    for (const [raw, want] of [
      ['5', 5],
      ['0', 0],
      ['true', 'true'],
      ['', ''],
      ['0x10', '0x10'],
      [' 5', ' 5'],
      ['1e3', '1e3'],
    ] as const) {
      expect(convertUrlValues(DashboardStateQuery, { after: raw }), raw).toEqual({ after: want });
    }
  });

  it('after=true on the dashboard state is a 400, not after=1', async () => {
    const leases = new LeaseStore({ clock: new FakeClock(Date.now()) });
    const server = await startDiscoveryServer({
      bindAddress: '127.0.0.1:0',
      leases,
      registry: new Registry(),
      token: TOKEN,
      // Validation runs before the handler: a stub is enough.
      handlers: { dashboardState: (_req, reply) => reply.type('application/json').send('{}') },
    });
    closers.push(
      () => leases.close(),
      () => server.close(),
    );
    for (const after of ['true', '', '0x10']) {
      const res = await fetch(`${server.url}/v1/dashboard/state?after=${after}`, { headers: AUTH });
      expect(res.status, after).toBe(400);
    }
    expect((await fetch(`${server.url}/v1/dashboard/state?after=7`, { headers: AUTH })).status).toBe(200);
  });
});

describe('path parameters', () => {
  it('a lease id of 128 characters outside the BMP is routed (the schema counts characters)', async () => {
    const { server } = await setup();
    const id = '😀'.repeat(128);
    const res = await fetch(`${server.url}/v1/leases/${encodeURIComponent(id)}/renew`, {
      method: 'POST',
      headers: AUTH,
    });
    expect(res.status).toBe(404);
    const longer = await fetch(`${server.url}/v1/leases/${encodeURIComponent(`${id}😀`)}`, {
      method: 'DELETE',
      headers: AUTH,
    });
    expect(longer.status).toBe(400);
  });

  it('one too long for the router is named by the route it was meant for', async () => {
    const { server } = await setup();
    expect(overlongParam(`/dashboard/${'x'.repeat(300)}`)).toBe('file');
    expect(overlongParam(`/v1/leases/${'x'.repeat(300)}/report`)).toBe('id');
    const res = await fetch(`${server.url}/v1/leases/${'x'.repeat(300)}`, {
      method: 'DELETE',
      headers: AUTH,
    });
    expect(res.status).toBe(400);
    expect(((await res.json()) as { error: { field?: string; message: string } }).error).toEqual({
      code: 'bad_request',
      message: 'id is longer than 128 characters',
      field: 'id',
    });
  });
});

describe('the OpenAPI document', () => {
  type Op = { responses: Record<string, unknown>; requestBody?: { required: boolean } };
  const doc = buildOpenApi() as { paths: Record<string, Record<string, Op>> };
  const op = (path: string, method: string): Op => {
    const found = doc.paths[path]?.[method];
    if (!found) throw new Error(`${method} ${path} missing`);
    return found;
  };

  it('declares the refusals a route can meet by its shape', () => {
    for (const [path, ops] of Object.entries(doc.paths)) {
      for (const [method, o] of Object.entries(ops)) {
        const codes = Object.keys(o.responses);
        if (o.requestBody)
          expect(codes, `${method} ${path}`).toEqual(expect.arrayContaining(['400', '413', '415']));
      }
    }
    expect(Object.keys(op('/v1/proxies', 'get').responses)).toEqual(expect.arrayContaining(['400', '431']));
    expect(Object.keys(op('/v1/leases/{id}', 'delete').responses)).toContain('400');
    expect(Object.keys(op('/dashboard/{file}', 'get').responses)).toContain('400');
    expect(Object.keys(op('/v1/internal/gateway/sync', 'post').responses)).toContain('404');
  });

  it('requires a body exactly where an empty one is refused', () => {
    expect(op('/v1/leases', 'post').requestBody?.required).toBe(false);
    expect(op('/v1/leases/{id}/renew', 'post').requestBody?.required).toBe(false);
    expect(op('/v1/leases/{id}/report', 'post').requestBody?.required).toBe(true);
    expect(op('/v1/reports', 'post').requestBody?.required).toBe(true);
    expect(op('/v1/sessions/{id}/report', 'post').requestBody?.required).toBe(true);
  });
});
