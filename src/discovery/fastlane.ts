/**
 * discovery/fastlane — the two calls crawlers make most, grant (`POST /v1/leases`) and release
 * (`DELETE /v1/leases/{id}`), answered straight from node:http when the request is ordinary:
 * admitted (token or Host), a JSON body of declared length within the limit, tracing and debug
 * logging off, this process deciding leases. Everything else — and any of these that is not
 * ordinary before its body is read — goes to the Fastify routes untouched. The answers are the
 * routes' answers byte for byte (test/unit/discovery/fastlane.test.ts), built from the same
 * validator, store calls, error mapping, serialisers and counters. Why it exists: the
 * framework's per-request work was the largest cost of the API left (docs/benchmarks.md).
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import fastJson from 'fast-json-stringify';
import type { Logger } from 'pino';
import type { LeaseStore } from '../lease/store.ts';
import { sameSecret } from './auth.ts';
import type { LeaseAuthority } from './authority.ts';
import { INTERNAL_ERROR, refusalOf } from './errors.ts';
import { noneLeasable } from './routes.ts';
import { ErrorBody, LeaseGrantBody, LeaseRequestBody, NoneLeasableBody } from './schemas.ts';
import { parseJsonBody, requestValidator } from './validation.ts';

export interface FastLaneOptions {
  leases: LeaseStore;
  /** The bearer token; without one, `admitsHost` decides. */
  token: string | undefined;
  admitsHost: (hostHeader: string | undefined) => boolean;
  authority?: LeaseAuthority;
  bodyLimit: number;
  log: Logger;
  countResponse(route: string, method: string, status: number): void;
  /** True once the server is closing: Fastify then answers 503 itself. */
  closing(): boolean;
}

/** Answers `req` and returns true, or returns false having touched nothing. */
export type FastLane = (req: IncomingMessage, res: ServerResponse) => boolean;

const LEASES = '/v1/leases';
const LEASE_PREFIX = '/v1/leases/';
const RELEASE_ROUTE = '/v1/leases/:id';
/** Ids the router passes through unchanged (no percent-encoding, no path separators). */
const PLAIN_ID = /^[A-Za-z0-9._~-]{1,128}$/;
const JSON_CONTENT_TYPE = 'application/json; charset=utf-8';

type Json = (value: unknown) => string;

export function fastLane(o: FastLaneOptions): FastLane {
  const checkBody = requestValidator(LeaseRequestBody, 'body');
  const grantJson = fastJson(LeaseGrantBody) as Json;
  const refusedJson = fastJson(NoneLeasableBody) as Json;
  const errorJson = fastJson(ErrorBody) as Json;
  const expected = o.token;

  const admitted = (req: IncomingMessage): boolean => {
    if (expected === undefined) return o.admitsHost(req.headers.host);
    const header = req.headers.authorization;
    // The plain form only; any other spelling goes the long way and gets the same answer.
    if (header === undefined || !header.startsWith('Bearer ')) return false;
    return sameSecret(header.slice(7).trim(), expected);
  };

  /** Writes a JSON answer with the headers Fastify would send, in its order, and counts it. */
  const send = (
    res: ServerResponse,
    route: string,
    status: number,
    headers: Record<string, string>,
    body: string,
  ): void => {
    headers['content-type'] = JSON_CONTENT_TYPE;
    headers['content-length'] = String(Buffer.byteLength(body));
    res.writeHead(status, headers);
    res.end(body);
    o.countResponse(route, route === LEASES ? 'POST' : 'DELETE', status);
  };

  const failed = (res: ServerResponse, route: string, err: unknown): void => {
    o.log.error({ err }, 'discovery handler error');
    send(res, route, 500, {}, errorJson(INTERNAL_ERROR));
    o.log.error(
      { method: route === LEASES ? 'POST' : 'DELETE', route, status: 500 },
      'discovery request failed',
    );
  };

  const grant = (res: ServerResponse, text: string): void => {
    const parsed = parseJsonBody(text);
    if (parsed.error) {
      // As the framework does after a body it could not parse: the connection is closed.
      send(res, LEASES, 400, { connection: 'close' }, errorJson(refusalOf(parsed.error, o.bodyLimit)?.body));
      return;
    }
    const checked = checkBody(parsed.value);
    if (checked.error) {
      send(res, LEASES, 400, {}, errorJson(refusalOf(checked.error, o.bodyLimit)?.body));
      return;
    }
    const body = checked.value as { target?: string };
    try {
      const out = o.leases.lease(body);
      if (out.granted) {
        send(res, LEASES, 201, { 'cache-control': 'no-store' }, grantJson(out.grant));
        return;
      }
      const refusal = noneLeasable(out, body.target, o.leases.now());
      const headers = { 'cache-control': 'no-store', 'retry-after': refusal.retryAfter };
      send(res, LEASES, 409, headers, refusedJson(refusal.body));
    } catch (err) {
      const refusal = refusalOf(err, o.bodyLimit);
      if (!refusal) {
        failed(res, LEASES, err);
        return;
      }
      const headers: Record<string, string> = refusal.retryAfter ? { 'retry-after': refusal.retryAfter } : {};
      send(res, LEASES, refusal.status, headers, errorJson(refusal.body));
    }
  };

  const readBody = (req: IncomingMessage, res: ServerResponse): void => {
    // Bodies are small: usually one chunk, decoded once.
    const chunks: Buffer[] = [];
    req.on('data', (chunk: Buffer) => {
      chunks.push(chunk);
    });
    req.on('end', () => {
      const bytes = chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks);
      grant(res, bytes.toString('utf8'));
    });
  };

  return (req, res) => {
    const method = req.method;
    const url = req.url;
    if (url === undefined || (method !== 'POST' && method !== 'DELETE')) return false;
    if (o.closing() || (o.authority !== undefined && !o.authority.isServing)) return false;
    if (o.log.isLevelEnabled('debug')) return false;
    if (method === 'POST') {
      if (url !== LEASES || !admitted(req)) return false;
      const headers = req.headers;
      const type = headers['content-type'];
      const length = Number(headers['content-length']);
      if (type !== 'application/json' && type !== JSON_CONTENT_TYPE) return false;
      if (headers['transfer-encoding'] !== undefined || !(length >= 0 && length <= o.bodyLimit)) return false;
      readBody(req, res);
      return true;
    }
    if (!url.startsWith(LEASE_PREFIX)) return false;
    const id = url.slice(LEASE_PREFIX.length);
    if (!PLAIN_ID.test(id) || !admitted(req)) return false;
    const headers = req.headers;
    if (headers['transfer-encoding'] !== undefined || (headers['content-length'] ?? '0') !== '0')
      return false;
    req.resume();
    try {
      o.leases.release(id);
    } catch (err) {
      failed(res, RELEASE_ROUTE, err);
      return true;
    }
    res.writeHead(204);
    res.end();
    o.countResponse(RELEASE_ROUTE, 'DELETE', 204);
    return true;
  };
}
