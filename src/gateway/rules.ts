/**
 * gateway/rules — which response rules match one answer (or its absence) and what they ask for
 * (docs/gateway.md, "Rules"). Pure: a response's status, headers, time to first byte and,
 * when a rule needs it, the start of its decoded body in; matched rules and one verdict out.
 * gateway/exchange acts on the verdict; the rules come from the providers config's
 * `gateway.rules` (validated by config/gateway-rules), or the defaults.
 */
import type { IncomingHttpHeaders } from 'node:http';
import {
  compileGlob,
  compilePattern,
  DEFAULT_RATE_LIMIT,
  DEFAULT_RULE_RETRIES,
} from '../config/gateway-rules.ts';
import type { GatewayRuleConfig } from '../config/schema.ts';
import { retryAfterSeconds } from '../crawler/outcome.ts';

export type RuleAction = GatewayRuleConfig['actions'][number];

/** Without `gateway.rules`: a 403 cools the upstream for the site, a 429 for as long as it asks; both retried. */
export const DEFAULT_RULES: readonly GatewayRuleConfig[] = [
  { name: 'blocked', status: [403], actions: ['block', 'retry'] },
  { name: 'rate-limited', status: [429], actions: ['rateLimit', 'retry'] },
];

/**
 * The default rules for the deprecated `--gateway-blocked-statuses`: 429 among them keeps its
 * rate-limit rule, the others block; an empty list means no rules.
 */
export function rulesForBlockedStatuses(statuses: readonly number[]): GatewayRuleConfig[] {
  const blocked = statuses.filter((s) => s !== 429);
  return [
    ...(blocked.length > 0 ? [{ ...DEFAULT_RULES[0]!, status: blocked }] : []),
    ...(statuses.includes(429) ? [DEFAULT_RULES[1]!] : []),
  ];
}

export interface Rule {
  name: string;
  hosts: RegExp[] | undefined;
  status: ReadonlySet<number> | undefined;
  header: { name: string; pattern: RegExp } | undefined;
  body: RegExp | undefined;
  timeToFirstByteMs: number | undefined;
  actions: readonly RuleAction[];
  retries: number;
  retryUnsafe: boolean;
  rateLimit: { defaultSeconds: number; minSeconds: number; maxSeconds: number };
  observe: boolean;
}

/** Compiles validated rule configs. */
export function compileRules(configs: readonly GatewayRuleConfig[]): Rule[] {
  return configs.map((c) => ({
    name: c.name,
    hosts: c.hosts?.map(compileGlob),
    status: c.status ? new Set(c.status) : undefined,
    header: c.header
      ? { name: c.header.name.toLowerCase(), pattern: compilePattern(c.header.pattern) }
      : undefined,
    body: c.body === undefined ? undefined : compilePattern(c.body),
    timeToFirstByteMs: c.timeToFirstByteMs,
    actions: c.actions,
    retries: c.retries ?? DEFAULT_RULE_RETRIES,
    retryUnsafe: c.retryUnsafe ?? false,
    rateLimit: { ...DEFAULT_RATE_LIMIT, ...c.rateLimit },
    observe: c.mode === 'observe',
  }));
}

/** The rules for one host (names lowercased, IPv6 without brackets). */
export function rulesFor(rules: readonly Rule[], host: string): Rule[] {
  const h = host.toLowerCase();
  return rules.filter((r) => !r.hosts || r.hosts.some((g) => g.test(h)));
}

/** An answer as far as rules see it; `timedOut` = no answer within the deadline. */
export type Observed =
  | { timedOut: true }
  | { timedOut: false; status: number; headers: IncomingHttpHeaders; ttfbMs: number };

function headerValue(headers: IncomingHttpHeaders, name: string): string | undefined {
  const v = headers[name];
  return Array.isArray(v) ? v.join(', ') : v;
}

/** Whether a rule's conditions other than `body` hold. */
function headMatches(r: Rule, o: Observed): boolean {
  if (o.timedOut) return r.timeToFirstByteMs !== undefined && !r.status && !r.header && !r.body;
  if (r.status && !r.status.has(o.status)) return false;
  if (r.timeToFirstByteMs !== undefined && o.ttfbMs <= r.timeToFirstByteMs) return false;
  if (r.header) {
    const v = headerValue(o.headers, r.header.name);
    if (v === undefined || !r.header.pattern.test(v)) return false;
  }
  return true;
}

/** Evaluation of one answer: the rules decided by the head, and those that wait for the body. */
export interface HeadMatch {
  matched: Rule[];
  /** Rules whose head conditions hold and whose `body` decides: the body must be read first. */
  needBody: Rule[];
}

export function matchHead(rules: readonly Rule[], o: Observed): HeadMatch {
  const matched: Rule[] = [];
  const needBody: Rule[] = [];
  for (const r of rules) {
    if (!headMatches(r, o)) continue;
    if (r.body) needBody.push(r);
    else matched.push(r);
  }
  return { matched, needBody };
}

/** The rules of `needBody` whose body expression finds `text` (the decoded start of the body). */
export function matchBody(needBody: readonly Rule[], text: string): Rule[] {
  return needBody.filter((r) => r.body?.test(text));
}

/** What the enforced rules among the matched ones ask for. */
export interface Verdict {
  block: boolean;
  /** A rateLimit cooldown in seconds (Retry-After clamped), when asked. */
  rateLimitSeconds: number | undefined;
  fail: boolean;
  /** Retries allowed in all (the most any matched rule allows), or 0. */
  retries: number;
  /** Whether a retry may repeat a non-idempotent method. */
  retryUnsafe: boolean;
}

export function verdict(matched: readonly Rule[], o: Observed, now: number): Verdict {
  const v: Verdict = {
    block: false,
    rateLimitSeconds: undefined,
    fail: false,
    retries: 0,
    retryUnsafe: false,
  };
  const asked = o.timedOut ? null : retryAfterSeconds(headerValue(o.headers, 'retry-after'), now);
  // Whole seconds: an HTTP date 1.2 s away still asks for 2.
  const after = asked === null ? undefined : Math.ceil(asked);
  for (const r of matched) {
    if (r.observe) continue;
    for (const a of r.actions) {
      if (a === 'block') v.block = true;
      else if (a === 'fail') v.fail = true;
      else if (a === 'retry') {
        v.retries = Math.max(v.retries, r.retries);
        v.retryUnsafe ||= r.retryUnsafe;
      } else {
        const { defaultSeconds, minSeconds, maxSeconds } = r.rateLimit;
        const s = Math.min(maxSeconds, Math.max(minSeconds, after ?? defaultSeconds));
        v.rateLimitSeconds = Math.max(v.rateLimitSeconds ?? 0, s);
      }
    }
  }
  return v;
}

/**
 * How long to wait for an answer's head: the upstream timeout, or less when an enforced rule
 * with only a time-to-first-byte condition would match a slower answer anyway.
 */
export function headDeadlineMs(rules: readonly Rule[], upstreamTimeoutMs: number): number {
  let ms = upstreamTimeoutMs;
  for (const r of rules) {
    if (r.observe || r.timeToFirstByteMs === undefined || r.status || r.header || r.body) continue;
    ms = Math.min(ms, r.timeToFirstByteMs);
  }
  return ms;
}

/** Methods a retry may repeat without `retryUnsafe` (RFC 9110 9.2.2). */
export const IDEMPOTENT_METHODS: ReadonlySet<string> = new Set([
  'GET',
  'HEAD',
  'OPTIONS',
  'TRACE',
  'PUT',
  'DELETE',
]);
