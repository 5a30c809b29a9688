/**
 * Response rules as the gateway evaluates them (docs/gateway.md, "Rules"): every condition of a
 * rule must hold, body rules wait for the body, observe rules never act, and the verdict
 * combines what the enforced rules ask for.
 */
import { describe, expect, it } from 'vitest';
import { retryAfterSeconds } from '../../../src/crawler/outcome.ts';
import {
  compileRules,
  DEFAULT_RULES,
  headDeadlineMs,
  matchBody,
  matchHead,
  type Observed,
  rulesFor,
  rulesForBlockedStatuses,
  verdict,
} from '../../../src/gateway/rules.ts';
import { gatewayRules } from '../../../src/gateway/service.ts';
import { captureLog } from '../../support/log.ts';

const answer = (status: number, headers: Record<string, string> = {}, ttfbMs = 5): Observed => ({
  timedOut: false,
  status,
  headers,
  ttfbMs,
});
const names = (rules: { name: string }[]) => rules.map((r) => r.name);
const NOW = Date.parse('2026-06-01T12:00:00Z');

describe('gateway rules', () => {
  it('defaults: 403 blocks and retries, 429 rate-limits and retries, others pass', () => {
    const rules = compileRules(DEFAULT_RULES);
    const m403 = matchHead(rules, answer(403)).matched;
    expect(names(m403)).toEqual(['blocked']);
    expect(verdict(m403, answer(403), NOW)).toEqual({
      block: true,
      rateLimitSeconds: undefined,
      fail: false,
      retries: 2,
      retryUnsafe: false,
    });
    const o429 = answer(429, { 'retry-after': '7' });
    expect(verdict(matchHead(rules, o429).matched, o429, NOW)).toMatchObject({
      rateLimitSeconds: 7,
      retries: 2,
    });
    expect(matchHead(rules, answer(200)).matched).toEqual([]);
  });

  it('maps the deprecated blocked statuses onto the default rules', () => {
    expect(rulesForBlockedStatuses([403, 503, 429])).toEqual([
      { name: 'blocked', status: [403, 503], actions: ['block', 'retry'] },
      { name: 'rate-limited', status: [429], actions: ['rateLimit', 'retry'] },
    ]);
    expect(rulesForBlockedStatuses([])).toEqual([]);
  });

  it('applies a rule to the hosts its globs name', () => {
    const rules = compileRules([
      { name: 'shop', hosts: ['*.shop.test', '[2001:db8::1]'], status: [403], actions: ['block'] },
    ]);
    expect(rulesFor(rules, 'A.Shop.Test')).toHaveLength(1);
    expect(rulesFor(rules, 'a.b.shop.test')).toHaveLength(1);
    expect(rulesFor(rules, 'shop.test')).toHaveLength(0);
    expect(rulesFor(rules, 'evilshop.test')).toHaveLength(0);
    expect(rulesFor(rules, '2001:db8::1')).toHaveLength(1);
  });

  it('needs every condition: status, header, time to first byte; body only after the head', () => {
    const rules = compileRules([
      { name: 'captcha', status: [200], body: '(?i)captcha', actions: ['block', 'retry'] },
      { name: 'flag', header: { name: 'X-Blocked', pattern: '^yes$' }, actions: ['fail'] },
      { name: 'slow', status: [200], timeToFirstByteMs: 1000, actions: ['block'] },
    ]);
    const head = matchHead(rules, answer(200, { 'x-blocked': 'yes' }, 1500));
    expect(names(head.matched)).toEqual(['flag', 'slow']);
    expect(names(head.needBody)).toEqual(['captcha']);
    expect(names(matchBody(head.needBody, '<p>Please solve the CAPTCHA</p>'))).toEqual(['captcha']);
    expect(matchBody(head.needBody, '<p>products</p>')).toEqual([]);
    expect(matchHead(rules, answer(200, { 'x-blocked': 'no' }, 10)).matched).toEqual([]);
    // A body rule whose status does not match never asks for the body (the answer streams).
    expect(matchHead(rules, answer(404)).needBody).toEqual([]);
  });

  it('matches a timeout only with rules of time to first byte alone', () => {
    const rules = compileRules([
      { name: 'timeout', timeToFirstByteMs: 2000, actions: ['fail', 'retry'] },
      { name: 'slow200', status: [200], timeToFirstByteMs: 2000, actions: ['block'] },
    ]);
    const m = matchHead(rules, { timedOut: true }).matched;
    expect(names(m)).toEqual(['timeout']);
    expect(verdict(m, { timedOut: true }, NOW)).toMatchObject({ fail: true, retries: 2 });
    // The head is awaited only as long as the enforced time-only rule allows.
    expect(headDeadlineMs(rules, 10_000)).toBe(2000);
    expect(headDeadlineMs(compileRules([{ ...DEFAULT_RULES[0]!, status: [403] }]), 10_000)).toBe(10_000);
  });

  it('observe rules match but ask for nothing', () => {
    const rules = compileRules([
      { name: 'watch', status: [403], actions: ['block', 'retry'], mode: 'observe' },
    ]);
    const m = matchHead(rules, answer(403)).matched;
    expect(names(m)).toEqual(['watch']);
    expect(verdict(m, answer(403), NOW)).toEqual({
      block: false,
      rateLimitSeconds: undefined,
      fail: false,
      retries: 0,
      retryUnsafe: false,
    });
    expect(
      headDeadlineMs(
        compileRules([{ name: 't', timeToFirstByteMs: 50, actions: ['fail'], mode: 'observe' }]),
        9000,
      ),
    ).toBe(9000);
  });

  it('clamps Retry-After (seconds or a date) and uses the default without it', () => {
    const rules = compileRules([
      {
        name: 'rl',
        status: [429, 503],
        actions: ['rateLimit'],
        rateLimit: { defaultSeconds: 30, minSeconds: 5, maxSeconds: 600 },
      },
    ]);
    const v = (headers: Record<string, string>) => verdict(rules, answer(429, headers), NOW).rateLimitSeconds;
    expect(v({})).toBe(30);
    expect(v({ 'retry-after': '1' })).toBe(5);
    expect(v({ 'retry-after': '100000' })).toBe(600);
    expect(v({ 'retry-after': new Date(NOW + 120_000).toUTCString() })).toBe(120);
    expect(v({ 'retry-after': 'soon' })).toBe(30);
    expect(retryAfterSeconds(new Date(NOW - 5000).toUTCString(), NOW)).toBe(0);
  });

  it('combines matched rules: the most retries, unsafe retries when any rule allows them', () => {
    const rules = compileRules([
      { name: 'a', status: [403], actions: ['retry'], retries: 1 },
      { name: 'b', status: [403], actions: ['retry', 'block'], retries: 4, retryUnsafe: true },
    ]);
    expect(verdict(rules, answer(403), NOW)).toMatchObject({ block: true, retries: 4, retryUnsafe: true });
  });
});

describe('gateway rules at start', () => {
  it('warns once that --gateway-blocked-statuses is deprecated, and lets gateway.rules win', () => {
    const a = captureLog('info');
    expect(gatewayRules({ blockedStatuses: [403] }, a.log)).toEqual([
      { name: 'blocked', status: [403], actions: ['block', 'retry'] },
    ]);
    expect(a.lines.map((l) => l.msg)).toEqual([
      '--gateway-blocked-statuses is deprecated: write gateway.rules in the providers config (docs/gateway.md, "Rules")',
    ]);
    const b = captureLog('info');
    const rules = [{ name: 'x', status: [451], actions: ['block' as const] }];
    expect(gatewayRules({ blockedStatuses: [403], rules }, b.log)).toBe(rules);
    expect(b.lines.map((l) => l.msg)).toEqual([
      '--gateway-blocked-statuses is deprecated and ignored: the providers config has gateway.rules',
    ]);
    const c = captureLog('info');
    expect(gatewayRules({}, c.log)).toBe(DEFAULT_RULES);
    expect(c.lines).toEqual([]);
  });
});
