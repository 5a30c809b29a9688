/**
 * discovery/client — a typed client for the discovery API, for crawler code written in
 * TypeScript/JavaScript. Uses the global fetch (or one you pass); errors are typed, and a
 * refused lease carries the "why nothing is leasable" arithmetic.
 */
import type { LeaseGrant, NoneLeasableCounts, ProxySnapshot, ReportResult } from '../lease/types.ts';

export type { LeaseGrant, NoneLeasableCounts, ProxySnapshot, ReportResult } from '../lease/types.ts';

export interface DiscoveryClientOptions {
  /** e.g. `http://proxy-operator-discovery.crawl:8090`. */
  baseUrl: string;
  /** The operator's DISCOVERY_TOKEN, if it has one. */
  token?: string;
  /** Per-request timeout; default 10 s. */
  timeoutMs?: number;
  fetch?: typeof globalThis.fetch;
}

export interface LeaseParams {
  /** Host, host:port or URL of the site you will crawl through the proxy. */
  target?: string;
  /** Label selector over Proxy labels, e.g. `pool=eu`. */
  selector?: string;
  namespace?: string;
  /** 1–3600; default 300. */
  ttlSeconds?: number;
}

export interface ReportParams {
  result: ReportResult;
  cooldownSeconds?: number;
  /** Default true: the report also releases the lease. */
  release?: boolean;
}

export interface CallOptions {
  signal?: AbortSignal;
}

/** Any non-success answer from the API. */
export class DiscoveryError extends Error {
  readonly status: number;
  readonly code: string;
  readonly field: string | undefined;
  constructor(status: number, code: string, message: string, field?: string) {
    super(message);
    this.name = 'DiscoveryError';
    this.status = status;
    this.code = code;
    this.field = field;
  }
}

/** 409: nothing matched the request right now; `counts` says why. Retry later or widen the selector. */
export class NoneLeasableError extends DiscoveryError {
  readonly counts: NoneLeasableCounts;
  /** When something matching may be leasable for the target (RFC 3339); null: nothing will by itself. */
  readonly retryAt: string | null;
  constructor(message: string, counts: NoneLeasableCounts, retryAt: string | null = null) {
    super(409, 'none_leasable', message);
    this.name = 'NoneLeasableError';
    this.counts = counts;
    this.retryAt = retryAt;
  }
}

/** 404 on renew/report: the lease expired or never existed. Take a new one. */
export class LeaseNotFoundError extends DiscoveryError {
  constructor(message: string) {
    super(404, 'not_found', message);
    this.name = 'LeaseNotFoundError';
  }
}

interface ErrorPayload {
  error?: { code?: string; message?: string; field?: string };
}

const COUNT_KEYS = [
  'matching',
  'ready',
  'healthy',
  'draining',
  'coolingDown',
  'coolingDownForTarget',
  'atCapacity',
] as const;

/** Proxies per `GET /v1/proxies` page when the client lists the fleet. */
export const LIST_PAGE_SIZE = 1000;

export class DiscoveryClient {
  private readonly base: string;
  private readonly token: string | undefined;
  private readonly timeoutMs: number;
  private readonly fetchFn: typeof globalThis.fetch;

  constructor(opts: DiscoveryClientOptions) {
    this.base = opts.baseUrl.replace(/\/+$/, '');
    this.token = opts.token;
    this.timeoutMs = opts.timeoutMs ?? 10_000;
    this.fetchFn = opts.fetch ?? globalThis.fetch;
  }

  /**
   * Every proxy the filter selects, read `pageSize` (default 1,000) at a time with the API's
   * `limit`/`continue`, so a fleet of 10,000 is ten small answers, not one large one. An API
   * without paging answers everything in the first page.
   */
  async listProxies(
    filter: { selector?: string; namespace?: string; target?: string } = {},
    opts: CallOptions & { pageSize?: number } = {},
  ): Promise<ProxySnapshot[]> {
    const { pageSize = LIST_PAGE_SIZE, ...call } = opts;
    const found: ProxySnapshot[] = [];
    let next: string | undefined;
    do {
      const q = new URLSearchParams();
      for (const [k, v] of Object.entries(filter)) if (v !== undefined) q.set(k, v);
      q.set('limit', String(pageSize));
      if (next !== undefined) q.set('continue', next);
      const page = (await this.call('GET', `/v1/proxies?${q}`, undefined, call)) as {
        proxies: ProxySnapshot[];
        continue?: string;
      };
      found.push(...page.proxies);
      next = page.continue;
    } while (next !== undefined);
    return found;
  }

  /** Throws NoneLeasableError (409) when nothing is leasable. */
  async lease(params: LeaseParams = {}, opts: CallOptions = {}): Promise<LeaseGrant> {
    return (await this.call('POST', '/v1/leases', params, opts)) as LeaseGrant;
  }

  /** Throws LeaseNotFoundError when the lease already expired. */
  async renew(
    id: string,
    ttlSeconds?: number,
    opts: CallOptions = {},
  ): Promise<{ id: string; expiresAt: string }> {
    const body = ttlSeconds === undefined ? {} : { ttlSeconds };
    return (await this.call('POST', `/v1/leases/${encodeURIComponent(id)}/renew`, body, opts)) as {
      id: string;
      expiresAt: string;
    };
  }

  /** Idempotent. */
  async release(id: string, opts: CallOptions = {}): Promise<void> {
    await this.call('DELETE', `/v1/leases/${encodeURIComponent(id)}`, undefined, opts);
  }

  async report(
    id: string,
    params: ReportParams,
    opts: CallOptions = {},
  ): Promise<{ id: string; released: boolean }> {
    return (await this.call('POST', `/v1/leases/${encodeURIComponent(id)}/report`, params, opts)) as {
      id: string;
      released: boolean;
    };
  }

  /**
   * Reports how proxy `namespace/name` did for `target` without a lease id (for a lease shared by
   * several requests, or one that ended long ago). Idempotent; releases nothing.
   */
  async reportProxy(
    proxy: { namespace: string; name: string },
    params: { target?: string; result: ReportResult; cooldownSeconds?: number },
    opts: CallOptions = {},
  ): Promise<{ proxy: { namespace: string; name: string }; target: string | null; result: string }> {
    const body = { proxy: { namespace: proxy.namespace, name: proxy.name }, ...params };
    return (await this.call('POST', '/v1/reports', body, opts)) as {
      proxy: { namespace: string; name: string };
      target: string | null;
      result: string;
    };
  }

  private async call(method: string, path: string, body: unknown, opts: CallOptions): Promise<unknown> {
    const headers: Record<string, string> = { accept: 'application/json' };
    if (this.token) headers.authorization = `Bearer ${this.token}`;
    if (body !== undefined) headers['content-type'] = 'application/json';
    const timeout = AbortSignal.timeout(this.timeoutMs);
    const signal = opts.signal ? AbortSignal.any([opts.signal, timeout]) : timeout;
    const res = await this.fetchFn(`${this.base}${path}`, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      signal,
    });
    if (res.status === 204) return undefined;
    const text = await res.text();
    let payload: unknown;
    try {
      payload = text === '' ? undefined : JSON.parse(text);
    } catch {
      payload = undefined;
    }
    if (res.ok) return payload;
    const err = (payload as ErrorPayload | undefined)?.error;
    const message = err?.message ?? `${method} ${path}: HTTP ${res.status}`;
    if (res.status === 409 && err?.code === 'none_leasable') {
      const p = payload as Record<string, unknown>;
      const counts = Object.fromEntries(
        COUNT_KEYS.map((k) => [k, Number(p[k] ?? 0)]),
      ) as unknown as NoneLeasableCounts;
      throw new NoneLeasableError(message, counts, typeof p.retryAt === 'string' ? p.retryAt : null);
    }
    if (res.status === 404 && err?.code === 'not_found' && path.startsWith('/v1/leases/')) {
      throw new LeaseNotFoundError(message);
    }
    throw new DiscoveryError(res.status, err?.code ?? 'http_error', message, err?.field);
  }
}
