/**
 * `--gcp-wire-full-payloads`: with wire logging on, every Compute Engine request and response
 * through the real client is one debug line with its body, cloud-init and secrets redacted;
 * with it off, no body is ever logged.
 */
import { Writable } from 'node:stream';
import { googleAuthLibrary } from 'google-gax';
import { pino } from 'pino';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import type { CallContext, CreateRequest } from '../../../src/provider/contract.ts';
import { createGcpProvider, type GcpProvider } from '../../../src/provider/gcp/index.ts';
import { redactBody, redactHeaders, redactJson, redactSecretQuery } from '../../../src/provider/gcp/wire.ts';
import { type FakeGce, startFakeGce } from '../../support/fake-gce.ts';

const PROJECT = 'proj-wire-1';
const ZONE = 'europe-west1-b';
const UID = '0a1b2c3d-1111-2222-3333-444455556666';
const NAME = 'px-0a1b2c3d11112222-9f8e7d6c5b';
const PASSWORD = 'S3cret-pass-word-xyz';
const CLOUD_INIT = `#cloud-config\n# CLOUD-INIT-MARKER-q7\nwrite_files:\n  - content: "crawler-7:${PASSWORD}"\n`;

let fake: FakeGce;
let lines: Array<Record<string, unknown>> = [];
let raw = '';
const providers: GcpProvider[] = [];

const log = pino(
  { level: 'trace' },
  new Writable({
    write(chunk: Buffer, _enc, cb) {
      raw += chunk.toString();
      for (const l of chunk.toString().split('\n').filter(Boolean)) lines.push(JSON.parse(l));
      cb();
    },
  }),
);

const ctx = (): CallContext => ({ signal: new AbortController().signal, log });

const req = (cloudInit?: string): CreateRequest => ({
  name: NAME,
  uid: UID,
  namespace: 'crawl',
  proxyName: 'eu-1',
  zone: ZONE,
  port: 3128,
  credentials: { username: 'crawler-7', password: PASSWORD },
  ...(cloudInit === undefined ? {} : { cloudInit }),
});

function make(wireLog: boolean | undefined): GcpProvider {
  const p = createGcpProvider({
    name: 'gcp-wire',
    config: { project: PROJECT },
    log,
    clientOptions: {
      apiEndpoint: '127.0.0.1',
      port: fake.port,
      protocol: 'http',
      authClient: new googleAuthLibrary.PassThroughClient(),
    },
    callTimeoutMs: 3000,
    ...(wireLog === undefined ? {} : { wireLog }),
  });
  providers.push(p);
  return p;
}

const wire = () => lines.filter((l) => l.wire !== undefined);

beforeAll(async () => {
  fake = await startFakeGce({ zones: [ZONE] });
});
afterAll(async () => {
  await fake.close();
});
beforeEach(() => {
  fake.instances.clear();
  fake.clearFaults();
  lines = [];
  raw = '';
});
afterEach(async () => {
  await Promise.all(providers.splice(0).map((p) => p.close()));
});

describe('gcp wire logging on', () => {
  it('logs each create request and response with name and labels, never user-data or the password', async () => {
    const p = make(true);
    const inst = await p.create(ctx(), req(CLOUD_INIT));
    expect(inst.name).toBe(NAME); // the client still reads the responses it got

    const w = wire();
    const insert = w.find((l) => l.wire === 'request' && l.method === 'POST');
    expect(insert).toBeDefined();
    expect(insert?.level).toBe(20); // debug
    expect(String(insert?.url)).toContain(`/projects/${PROJECT}/zones/${ZONE}/instances`);
    const body = insert?.body as {
      name: string;
      labels: Record<string, string>;
      metadata: { items: Array<{ key: string; value: string }> };
    };
    expect(body.name).toBe(NAME);
    expect(body.labels['proxy-operator-uid']).toBe(UID);
    expect(body.metadata.items.find((i) => i.key === 'user-data')?.value).toBe(
      `[redacted ${Buffer.byteLength(CLOUD_INIT)} bytes]`,
    );

    const responses = w.filter((l) => l.wire === 'response');
    // insert, the wait on its operation, then the read-back get: one response line each.
    expect(responses.map((l) => l.method)).toEqual(['POST', 'POST', 'GET']);
    expect(String(responses[1]?.url)).toMatch(/\/operations\/operation-[^/?]+\/wait(\?|$)/);
    for (const r of responses) {
      expect(r.status).toBe(200);
      expect(typeof r.durationMs).toBe('number');
      expect(r.durationMs as number).toBeGreaterThanOrEqual(0);
    }
    const got = responses[2]?.body as typeof body;
    expect(got.name).toBe(NAME);
    expect(got.labels['proxy-operator-managed']).toBe('true');
    // GCE echoes the metadata back on get: redacted there as well.
    expect(got.metadata.items.find((i) => i.key === 'user-data')?.value).toMatch(/^\[redacted \d+ bytes\]$/);
    expect(w.filter((l) => l.wire === 'request').length).toBe(3);

    expect(raw).not.toContain(PASSWORD);
    expect(raw).not.toContain('CLOUD-INIT-MARKER-q7');
    expect(raw).not.toContain(Buffer.from(CLOUD_INIT).toString('base64').slice(0, 24));
  });

  it('logs a rejected (403) response with its status and error body, the default cloud-init redacted', async () => {
    const p = make(true);
    fake.inject({ match: /^POST /, status: 403, reason: 'QUOTA_EXCEEDED', message: 'no access', times: 1 });
    // The client still decodes the rejected 403 it was handed back.
    await expect(p.create(ctx(), req())).rejects.toMatchObject({ errorClass: 'QuotaExceeded' });
    const res = wire().find((l) => l.wire === 'response' && l.method === 'POST');
    expect(res?.status).toBe(403);
    expect(JSON.stringify(res?.body)).toContain('no access');
    expect(raw).not.toContain(PASSWORD);
  });
});

describe('gcp wire logging off', () => {
  for (const wireLog of [undefined, false]) {
    it(`logs no wire line and no body (wireLog: ${wireLog})`, async () => {
      const p = make(wireLog);
      await p.create(ctx(), req(CLOUD_INIT));
      expect(fake.instances.size).toBe(1);
      expect(wire()).toEqual([]);
      expect(raw).not.toContain('"body"');
      expect(raw).not.toContain('metadata');
      expect(raw).not.toContain(PASSWORD);
    });
  }
});

describe('redaction', () => {
  it('redacts secret-like fields anywhere and cloud-init metadata values by size', () => {
    expect(
      redactJson({
        name: 'vm',
        metadata: {
          items: [
            { key: 'user-data', value: 'héllo' },
            { key: 'ssh-keys', value: 'pub' },
          ],
        },
        nested: [
          { password: 'p', private_key: 'k', privateKey: 'k', client_secret: 's', refresh_token: 't' },
        ],
      }),
    ).toEqual({
      name: 'vm',
      metadata: {
        items: [
          { key: 'user-data', value: '[redacted 6 bytes]' },
          { key: 'ssh-keys', value: 'pub' },
        ],
      },
      nested: [
        {
          password: '[redacted]',
          private_key: '[redacted]',
          privateKey: '[redacted]',
          client_secret: '[redacted]',
          refresh_token: '[redacted]',
        },
      ],
    });
  });

  it('never logs a non-JSON body, redacts Authorization and token query parameters', () => {
    expect(redactBody('user:pass')).toBe('[non-JSON body, 9 bytes]');
    expect(redactBody('')).toBeUndefined();
    expect(redactHeaders(new Headers({ Authorization: 'Bearer abc', 'content-type': 'x' }))).toEqual({
      authorization: '[redacted]',
      'content-type': 'x',
    });
    const u = redactSecretQuery('http://h/compute/v1/x?filter=a%3Db&access_token=abc&maxResults=5');
    expect(u).toContain('filter=a%3Db');
    expect(u).toContain('maxResults=5');
    expect(u).not.toContain('abc');
  });
});
