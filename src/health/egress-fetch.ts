/**
 * health/egress-fetch — one GET through one forward proxy for the egress-IP check, on undici's
 * ProxyAgent: a CONNECT tunnel + verified TLS for https, an absolute-form request for http.
 * Unlike the health probe (health/probe) it runs once per proxy every few minutes, so it has no
 * CPU budget that would justify a hand-written client. Errors name hosts, ports and statuses,
 * never credentials.
 */
import { isIP } from 'node:net';
import type { Dispatcher } from 'undici';
import { proxyUrl, redactUrl } from '../api/url.ts';
import { errorMessage } from '../log/errors.ts';
import type { ProbeOptions, ProbeTarget } from './probe.ts';

/** Bigger answers are not an IP service: refuse them instead of buffering. */
const MAX_RESPONSE_BYTES = 64 * 1024;
const USER_AGENT = 'egress-proxies-operator-egress-ip/1';

export class EgressFetchError extends Error {
  readonly status: number | undefined;
  constructor(message: string, status?: number) {
    super(message);
    this.name = 'EgressFetchError';
    this.status = status;
  }
}

export interface EgressFetchOptions {
  timeoutMs: number;
  signal?: AbortSignal;
  /** Extra trust anchors for an https URL; the system roots otherwise. */
  ca?: ProbeOptions['ca'];
}

/**
 * undici 8 needs a newer Node than standalone mode promises (see docs/architecture.md), so it
 * is loaded only when an egress-IP check actually runs.
 */
let undici: Promise<typeof import('undici')> | undefined;
const loadUndici = () => {
  undici ??= import('undici');
  return undici;
};

/**
 * GETs `url` through the forward proxy at `target` and returns status and body. Bounded by
 * `timeoutMs` and `signal`; the agent, and with it every socket it opened, is destroyed when it
 * settles. Throws EgressFetchError for anything but a complete response.
 */
export async function fetchThroughProxy(
  target: ProbeTarget,
  url: string,
  opts: EgressFetchOptions,
): Promise<{ status: number; body: string }> {
  const shownUrl = redactUrl(url);
  const proxyName = `${isIP(target.host) === 6 ? `[${target.host}]` : target.host}:${target.port}`;
  const deadline = AbortSignal.timeout(opts.timeoutMs);
  const signal = opts.signal ? AbortSignal.any([opts.signal, deadline]) : deadline;
  const { ProxyAgent } = await loadUndici();
  const agent = new ProxyAgent({
    uri: proxyUrl(target.host, target.port),
    ...(target.credentials ? { token: basicAuth(target.credentials) } : {}),
    ...(opts.ca === undefined ? {} : { requestTls: { ca: opts.ca } }),
  });
  try {
    const res = await agent.request({
      ...originAndPath(url),
      method: 'GET',
      headers: { 'user-agent': USER_AGENT, accept: 'text/plain, application/json;q=0.9, */*;q=0.5' },
      signal,
    });
    return { status: res.statusCode, body: await readCapped(res.body, shownUrl) };
  } catch (err) {
    if (opts.signal?.aborted) throw new EgressFetchError('aborted');
    if (deadline.aborted) throw new EgressFetchError(`no answer within ${opts.timeoutMs} ms`);
    if (err instanceof EgressFetchError) throw err;
    const refused = connectStatus(err);
    if (refused !== undefined) {
      throw new EgressFetchError(
        `proxy ${proxyName} answered CONNECT ${new URL(url).host} with ${refused}`,
        refused,
      );
    }
    throw new EgressFetchError(`GET ${shownUrl} via proxy ${proxyName} failed: ${describe(err)}`);
  } finally {
    await agent.destroy().catch(() => undefined);
  }
}

/** The request target without userinfo: credentials for the origin are never sent on. */
function originAndPath(url: string): { origin: string; path: string } {
  const u = new URL(url);
  return { origin: u.origin, path: `${u.pathname}${u.search}` };
}

async function readCapped(body: Dispatcher.ResponseData['body'], shownUrl: string): Promise<string> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of body) {
    size += (chunk as Buffer).length;
    if (size > MAX_RESPONSE_BYTES) {
      body.destroy();
      throw new EgressFetchError(`${shownUrl}: answer larger than ${MAX_RESPONSE_BYTES} bytes`);
    }
    chunks.push(chunk as Buffer);
  }
  return Buffer.concat(chunks).toString('utf8');
}

/** The status a proxy refused the CONNECT tunnel with, from undici's error (407, 403, 502, …). */
function connectStatus(err: unknown): number | undefined {
  const m = /^Proxy response \((\d{3})\) !== 200 when HTTP Tunneling/.exec(errorMessage(err));
  return m ? Number(m[1]) : undefined;
}

/** undici's message, with the system error code (ECONNREFUSED, …) when the message lacks it. */
function describe(err: unknown): string {
  const message = errorMessage(err);
  const code = (err as { code?: unknown } | undefined)?.code;
  const systemCode = typeof code === 'string' && /^E[A-Z]+$/.test(code);
  return systemCode && !message.includes(code) ? `${message} (${code})` : message;
}

function basicAuth(creds: { username: string; password: string }): string {
  return `Basic ${Buffer.from(`${creds.username}:${creds.password}`, 'utf8').toString('base64')}`;
}
