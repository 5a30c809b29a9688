/// <reference lib="dom" />
/**
 * dashboard/web/api — the page's two data requests, with the discovery API token as a bearer
 * header (never in a URL, so it stays out of access logs and history). The token lives in this
 * tab's sessionStorage only. Each answer says when it arrived (`performance.now()` as the
 * response began), so the page can time its own handling of it.
 */
import type { DashboardState, LatencyHistoryBody } from './types.ts';

const TOKEN_KEY = 'egress-proxies-operator.discovery-token';

export class Unauthorized extends Error {}

export function storedToken(): string | null {
  return sessionStorage.getItem(TOKEN_KEY);
}

export function storeToken(token: string | null): void {
  if (token) sessionStorage.setItem(TOKEN_KEY, token);
  else sessionStorage.removeItem(TOKEN_KEY);
}

export interface Answer<T> {
  body: T;
  /** performance.now() when the response began: what follows is the page's own work. */
  received: number;
}

async function getJson<T>(path: string): Promise<Answer<T>> {
  const token = storedToken();
  const res = await fetch(path, {
    cache: 'no-store',
    headers: token
      ? { authorization: `Bearer ${token}`, accept: 'application/json' }
      : { accept: 'application/json' },
  });
  const received = performance.now();
  if (res.status === 401) throw new Unauthorized('the discovery API wants a token');
  if (!res.ok) {
    const body = (await res.json().catch(() => null)) as { error?: { message?: string } } | null;
    throw new Error(body?.error?.message ?? `${path} answered ${res.status}`);
  }
  return { body: (await res.json()) as T, received };
}

export interface StateParams {
  /** Events after this seq. */
  after: number;
  /** The revision held: only rows changed after it. */
  since?: number | undefined;
  /** Continue a full load after this key. */
  from?: string | undefined;
  /** Rows per page of a full load. */
  limit: number;
}

export function fetchState(p: StateParams): Promise<Answer<DashboardState>> {
  const q = new URLSearchParams({ after: String(p.after), limit: String(p.limit) });
  if (p.since !== undefined) q.set('since', String(p.since));
  if (p.from !== undefined) q.set('from', p.from);
  return getJson<DashboardState>(`/v1/dashboard/state?${q}`);
}

/** Keys per history request: keeps its URL far below the server's header limit. */
const HISTORY_URL_CHARS = 6000;

/** The latency history of the proxies `keys` (the rows shown), in as few requests as fit. */
export async function fetchHistory(keys: readonly string[]): Promise<LatencyHistoryBody> {
  const groups: string[][] = [[]];
  let chars = 0;
  for (const k of keys) {
    const n = encodeURIComponent(k).length + 3;
    if (chars + n > HISTORY_URL_CHARS && (groups.at(-1) as string[]).length > 0) {
      groups.push([]);
      chars = 0;
    }
    (groups.at(-1) as string[]).push(k);
    chars += n;
  }
  const answers = await Promise.all(
    groups.map((g) =>
      getJson<LatencyHistoryBody>(`/v1/dashboard/history?${new URLSearchParams({ proxies: g.join(',') })}`),
    ),
  );
  const first = (answers[0] as Answer<LatencyHistoryBody>).body;
  for (const a of answers.slice(1)) Object.assign(first.series, a.body.series);
  return first;
}
