/**
 * crawler/outcome — whose fault a fetch through a leased proxy was, and what to report: the
 * table "What to report" in docs/lease-api.md as pure functions, the TypeScript twin of
 * clients/python/egress_proxies/outcome.py. Only a proxy that cannot be reached is `failed`; an
 * answer from the proxy about the origin (marked `X-Proxy-Error`, or a 5xx to a CONNECT) is the
 * origin's; a 407 means the lease ended; the site's own refusals are `blocked`. Both twins pass
 * one table of cases, clients/outcome-cases.json.
 */

/** The header our proxies mark their own answers about an origin with. */
export const PROXY_ERROR_HEADER = 'x-proxy-error';

/** Report `failed`: the proxy could not be reached or broke the protocol. */
export const PROXY_FAULT = 'proxy';
/** Report nothing: the proxy works, the site did not answer. */
export const ORIGIN_FAULT = 'origin';
/** 407: the lease (or the proxy's credentials) ended; take a new lease. */
export const LEASE_ENDED = 'lease';
/** The egress policy refused the destination; no proxy will reach it. */
export const DENIED = 'denied';
/** A timeout or cut after the proxy accepted: cannot tell, report nothing. */
export const UNKNOWN = 'unknown';

export type Fault =
  | typeof PROXY_FAULT
  | typeof ORIGIN_FAULT
  | typeof LEASE_ENDED
  | typeof DENIED
  | typeof UNKNOWN;

/** Error codes of a connection *to the proxy* that failed (Node's and undici's names). */
const PROXY_CONNECT_CODES = new Set([
  'ECONNREFUSED',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'ENOTFOUND',
  'EAI_AGAIN',
  'UND_ERR_CONNECT_TIMEOUT',
]);

/**
 * undici's ProxyAgent: "Proxy response (502) !== 200 when HTTP Tunneling"; requests' "Tunnel
 * connection failed: 502"; Scrapy's "{'status': 502, ...}" (the Python package reads the same three).
 */
const TUNNEL_STATUS = /Proxy response \((\d{3})\)|Tunnel connection failed: (\d{3})|'status': (\d{3})/;

/** The status a proxy answered a CONNECT with, read from a client's error message; null if none. */
export function tunnelStatus(message: string): number | null {
  const m = TUNNEL_STATUS.exec(message);
  return m ? Number(m[1] ?? m[2] ?? m[3]) : null;
}

/**
 * What an HTTP status from the proxy's side means, or null when it is the origin's own answer.
 * `proxyError` is the X-Proxy-Error header (plain HTTP through the proxy); a CONNECT refusal
 * shows no headers to most clients, so `connect` reads the status alone.
 */
export function statusFault(status: number, proxyError?: string | null, connect = false): Fault | null {
  if (status === 407) return LEASE_ENDED;
  if (proxyError) return proxyError === 'egress-denied' ? DENIED : ORIGIN_FAULT;
  if (connect) {
    if (status === 403) return DENIED;
    if (status >= 500 && status <= 599) return ORIGIN_FAULT;
    return PROXY_FAULT;
  }
  return null;
}

/** The error and what it wraps (`cause`, an AggregateError's `errors`), each once. */
function* causes(err: unknown): Generator<unknown> {
  const seen = new Set<unknown>();
  const todo = [err];
  while (todo.length > 0) {
    const cur = todo.pop();
    if (cur === null || typeof cur !== 'object' || seen.has(cur)) continue;
    seen.add(cur);
    yield cur;
    const e = cur as { cause?: unknown; errors?: unknown };
    todo.push(e.cause);
    if (Array.isArray(e.errors)) todo.push(...e.errors);
  }
}

/** PROXY_FAULT, ORIGIN_FAULT, LEASE_ENDED, DENIED or UNKNOWN for an error of a fetch through a proxy. */
export function classifyError(err: unknown): Fault {
  for (const e of causes(err)) {
    const status = tunnelStatus(String((e as { message?: unknown }).message ?? ''));
    if (status !== null) return statusFault(status, null, true) ?? UNKNOWN;
  }
  for (const e of causes(err)) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === 'string' && PROXY_CONNECT_CODES.has(code)) return PROXY_FAULT;
  }
  return UNKNOWN;
}

/** A Retry-After header (delta-seconds or an HTTP date) as seconds from `now`, or null. */
export function retryAfterSeconds(value: string | null | undefined, now = Date.now()): number | null {
  if (value === null || value === undefined) return null;
  const v = value.trim();
  if (/^\d+$/.test(v)) return Number(v);
  const at = Date.parse(v);
  if (Number.isNaN(at)) return null;
  return Math.max(0, (at - now) / 1000);
}
