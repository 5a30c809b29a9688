/**
 * config/gateway-rules — the providers config's `gateway.rules` beyond their shape: patterns and
 * globs that compile, names that are unique, clamps in order, at least one condition per rule
 * (docs/gateway.md, "Rules"). The compilers live here so that what validation accepts is exactly
 * what the gateway (gateway/rules) runs.
 */
import type { GatewayRuleConfig } from './schema.ts';

/** A leading `(?i)`, `(?s)`, `(?m)` or a mix (`(?is)`) becomes the expression's flags. */
const INLINE_FLAGS = /^\(\?([ims]+)\)/;

/** The regular expression of a rule's `pattern` or `body`; throws SyntaxError with the engine's reason. */
export function compilePattern(text: string): RegExp {
  const m = INLINE_FLAGS.exec(text);
  return m ? new RegExp(text.slice(m[0].length), [...new Set(m[1])].join('')) : new RegExp(text);
}

const GLOB = /^[a-z0-9*.:[\]-]+$/i;

/** Whether `glob` is a host glob: letters, digits, ".", "-", ":", brackets and "*". */
export function isHostGlob(glob: string): boolean {
  return GLOB.test(glob);
}

/** A host glob as a whole-name, case-insensitive expression: `*` is any run of characters. */
export function compileGlob(glob: string): RegExp {
  const body = glob
    .replace(/^\[(.*)\]$/, '$1')
    .toLowerCase()
    .split('*')
    .map((part) => part.replace(/[.[\]]/g, '\\$&'))
    .join('.*');
  return new RegExp(`^${body}$`);
}

const RULE_NAME = /^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$/;
/** The gateway reads at most this much of a body for a `body` rule. */
export const RULE_BODY_BYTES = 64 * 1024;
export const DEFAULT_RULE_RETRIES = 2;
export const MAX_RULE_RETRIES = 10;
export const DEFAULT_RATE_LIMIT = { defaultSeconds: 60, minSeconds: 1, maxSeconds: 3600 } as const;
/** The longest cooldown a rateLimit may set (the lease API's cap for any report). */
export const MAX_RATE_LIMIT_SECONDS = 86_400;

/** One problem of a rule: the field under `gateway.rules[i]` and what is wrong with it. */
export interface RuleProblem {
  field: string;
  message: string;
  /** A setting that does nothing (warned about, not refused). */
  warning?: true;
}

/** Problems of one rule whose shape is right; `seen` collects names to find duplicates. */
export function ruleProblems(
  rule: GatewayRuleConfig,
  index: number,
  seen: Map<string, number>,
): RuleProblem[] {
  const out: RuleProblem[] = [];
  const add = (field: string, message: string) => out.push({ field, message });
  const unused = (field: string, action: string) =>
    out.push({ field, message: `is set but actions has no ${action}, so it does nothing`, warning: true });
  if (!RULE_NAME.test(rule.name)) {
    add(
      'name',
      `${JSON.stringify(rule.name)} is not a rule name: lowercase letters, digits and "-", 1-63 characters`,
    );
  } else {
    const first = seen.get(rule.name);
    if (first !== undefined)
      add('name', `duplicate rule name ${JSON.stringify(rule.name)} (also gateway.rules[${first}])`);
    else seen.set(rule.name, index);
  }
  rule.hosts?.forEach((h, j) => {
    if (!isHostGlob(h))
      add(`hosts[${j}]`, `${JSON.stringify(h)} is not a host glob: letters, digits, ".", "-", ":" and "*"`);
  });
  rule.status?.forEach((s, j) => {
    if (s < 100 || s > 599) add(`status[${j}]`, `${s} is not an HTTP status (100-599)`);
  });
  const regex = (field: string, text: string) => {
    try {
      compilePattern(text);
    } catch (err) {
      add(field, `invalid regular expression ${JSON.stringify(text)}: ${(err as Error).message}`);
    }
  };
  if (rule.header) {
    if (!/^[!#$%&'*+.^_`|~0-9a-z-]+$/i.test(rule.header.name)) {
      add('header.name', `${JSON.stringify(rule.header.name)} is not an HTTP header name`);
    }
    regex('header.pattern', rule.header.pattern);
  }
  if (rule.body !== undefined) regex('body', rule.body);
  if (
    rule.timeToFirstByteMs !== undefined &&
    (rule.timeToFirstByteMs < 1 || rule.timeToFirstByteMs > 600_000)
  ) {
    add('timeToFirstByteMs', `${rule.timeToFirstByteMs} is out of range: 1-600000 milliseconds`);
  }
  if (
    rule.status === undefined &&
    rule.header === undefined &&
    rule.body === undefined &&
    rule.timeToFirstByteMs === undefined
  ) {
    add('', 'needs at least one condition: status, header, body or timeToFirstByteMs');
  }
  if (rule.actions.length === 0) add('actions', 'needs at least one of retry, block, rateLimit, fail');
  const dup = rule.actions.find((a, j) => rule.actions.indexOf(a) !== j);
  if (dup) add('actions', `names ${dup} twice`);
  if (rule.retries !== undefined && (rule.retries < 1 || rule.retries > MAX_RULE_RETRIES)) {
    add('retries', `${rule.retries} is out of range: 1-${MAX_RULE_RETRIES}`);
  }
  if (rule.retries !== undefined && !rule.actions.includes('retry')) unused('retries', 'retry');
  if (rule.retryUnsafe && !rule.actions.includes('retry')) unused('retryUnsafe', 'retry');
  if (rule.rateLimit) {
    if (!rule.actions.includes('rateLimit')) unused('rateLimit', 'rateLimit');
    const r = { ...DEFAULT_RATE_LIMIT, ...rule.rateLimit };
    for (const k of ['defaultSeconds', 'minSeconds', 'maxSeconds'] as const) {
      if (r[k] < 1 || r[k] > MAX_RATE_LIMIT_SECONDS) {
        add(`rateLimit.${k}`, `${r[k]} is out of range: 1-${MAX_RATE_LIMIT_SECONDS} seconds`);
      }
    }
    if (r.minSeconds > r.maxSeconds)
      add('rateLimit.minSeconds', `${r.minSeconds} is above maxSeconds ${r.maxSeconds}`);
  }
  return out;
}
