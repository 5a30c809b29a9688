/// <reference lib="dom" />
/**
 * dashboard/web/api — the page's two data requests, with the discovery API token as a bearer
 * header (never in a URL, so it stays out of access logs and history). The token lives in this
 * tab's sessionStorage only.
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

async function getJson<T>(path: string): Promise<T> {
  const token = storedToken();
  const res = await fetch(path, {
    cache: 'no-store',
    headers: token
      ? { authorization: `Bearer ${token}`, accept: 'application/json' }
      : { accept: 'application/json' },
  });
  if (res.status === 401) throw new Unauthorized('the discovery API wants a token');
  if (!res.ok) {
    const body = (await res.json().catch(() => null)) as { error?: { message?: string } } | null;
    throw new Error(body?.error?.message ?? `${path} answered ${res.status}`);
  }
  return (await res.json()) as T;
}

export function fetchState(after: number): Promise<DashboardState> {
  return getJson<DashboardState>(`/v1/dashboard/state?after=${after}`);
}

export function fetchHistory(): Promise<LatencyHistoryBody> {
  return getJson<LatencyHistoryBody>('/v1/dashboard/history');
}
