/**
 * The TypeScript helpers against the repository's one table of outcome cases,
 * clients/outcome-cases.json, which the Python package's tests run too
 * (clients/python/tests/test_outcome.py): both implementations agree on every case.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { classifyError, retryAfterSeconds, statusFault, tunnelStatus } from '../../../src/crawler/outcome.ts';

interface Cases {
  status: { status: number; proxyError: string | null; connect: boolean; fault: string | null }[];
  tunnel: { client: string; message: string; status: number | null; fault: string }[];
  connectErrors: { python: string; node: string; wrapped: boolean; fault: string }[];
  retryAfter: { value: string | null; now: string; seconds: number | null }[];
}

const CASES = JSON.parse(
  readFileSync(join(import.meta.dirname, '../../../clients/outcome-cases.json'), 'utf8'),
) as Cases;

describe('clients/outcome-cases.json, in TypeScript', () => {
  it('has cases of every kind', () => {
    for (const kind of ['status', 'tunnel', 'connectErrors', 'retryAfter'] as const) {
      expect(CASES[kind].length, kind).toBeGreaterThan(0);
    }
  });

  it.each(CASES.status)('status $status, X-Proxy-Error $proxyError, CONNECT $connect → $fault', (c) => {
    expect(statusFault(c.status, c.proxyError, c.connect)).toBe(c.fault);
  });

  it.each(CASES.tunnel)('$client: "$message" → $status, $fault', (c) => {
    expect(tunnelStatus(c.message)).toBe(c.status);
    expect(classifyError(new Error(c.message))).toBe(c.fault);
  });

  it.each(CASES.connectErrors)('$node (wrapped: $wrapped) → $fault', (c) => {
    const err = Object.assign(new Error('connecting to the proxy'), { code: c.node });
    expect(classifyError(c.wrapped ? new Error("the client's own error", { cause: err }) : err)).toBe(
      c.fault,
    );
  });

  it.each(CASES.retryAfter)('Retry-After $value at $now → $seconds', (c) => {
    expect(retryAfterSeconds(c.value, Date.parse(c.now))).toBe(c.seconds);
  });
});
