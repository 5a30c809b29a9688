/**
 * api/pool-rules — the ProxyPool's cross-field rules, written twice side by side like the
 * Proxy's (api/rules): the CEL the CRD carries and the TypeScript twin standalone mode runs.
 * The template's Proxy spec carries the Proxy rules themselves; `checkProxyPoolRules` runs them
 * too, reporting under `spec.template.spec`.
 */
import { type CelRule, checkProxyRules } from './rules.ts';
import type { FieldError } from './schema-errors.ts';

interface PoolView {
  metadata?: { name?: string };
}
interface PoolSpecView {
  template?: { spec?: { type?: string } };
  rollingUpdate?: RollingView;
  rotation?: RotationView;
}
interface RollingView {
  maxSurge?: number;
  maxUnavailable?: number;
}
interface RotationView {
  maxAge?: string;
  strategy?: string;
}

/** The shortest maxAge: recycling faster than a proxy can come up and pass its probes thrashes. */
export const MIN_MAX_AGE_SECONDS = 10;

/**
 * The pool's name is the value of its Proxies' pool label, and label values stop at 63
 * characters. The rule sits on `metadata.name` itself: the API server accepts a CEL rule there
 * (and reports it at that path), but rejects a root rule whose fieldPath points into metadata,
 * which a CRD schema may not declare.
 */
export const POOL_NAME_RULES: readonly CelRule<string>[] = [
  {
    rule: 'self.size() <= 63',
    message:
      'must be at most 63 characters: it is the value of the crawl.example.com/pool label on every Proxy',
    reason: 'FieldValueInvalid',
    holds: (name) => name.length <= 63,
  },
];

export const POOL_SPEC_RULES: readonly CelRule<PoolSpecView>[] = [
  {
    rule: "!has(self.template.spec.type) || self.template.spec.type == 'Managed'",
    message: 'template.spec.type must be Managed: a pool provisions its Proxies through a provider',
    fieldPath: '.template.spec.type',
    reason: 'FieldValueInvalid',
    holds: (s) => (s.template?.spec?.type ?? 'Managed') === 'Managed',
  },
  {
    rule: "!has(self.rotation) || !has(self.rotation.strategy) || self.rotation.strategy != 'Restart' || (has(self.rollingUpdate) && has(self.rollingUpdate.maxUnavailable) && self.rollingUpdate.maxUnavailable >= 1)",
    message:
      'rollingUpdate.maxUnavailable must be at least 1 with rotation.strategy Restart: a Proxy being restarted serves nothing, and no surge Proxy stands in for it',
    fieldPath: '.rollingUpdate.maxUnavailable',
    reason: 'FieldValueInvalid',
    holds: (s) => s.rotation?.strategy !== 'Restart' || (s.rollingUpdate?.maxUnavailable ?? 0) >= 1,
  },
];

export const POOL_ROLLING_RULES: readonly CelRule<RollingView>[] = [
  {
    rule: '(has(self.maxSurge) ? self.maxSurge : 1) > 0 || (has(self.maxUnavailable) ? self.maxUnavailable : 0) > 0',
    message: 'maxSurge and maxUnavailable cannot both be 0: a roll-out could never replace a Proxy',
    fieldPath: '.maxSurge',
    reason: 'FieldValueInvalid',
    holds: (r) => (r.maxSurge ?? 1) > 0 || (r.maxUnavailable ?? 0) > 0,
  },
];

/**
 * Go-style durations without days: `90s`, `20m`, `1h30m`. The digit limits keep the longest
 * (999999h9999999m999999999s, about 165 years) within what a duration holds, so CEL's
 * `duration()` can parse every string that matches.
 */
export const DURATION_PATTERN = '^([0-9]{1,6}h)?([0-9]{1,7}m)?([0-9]{1,9}s)?$';
const DURATION = new RegExp(DURATION_PATTERN);

/** Seconds of a duration matching DURATION_PATTERN (and not empty); NaN for anything else. */
export function durationSeconds(text: string): number {
  const m = text === '' ? null : DURATION.exec(text);
  if (!m) return Number.NaN;
  return (
    (Number(m[1]?.slice(0, -1) ?? 0) * 60 + Number(m[2]?.slice(0, -1) ?? 0)) * 60 +
    Number(m[3]?.slice(0, -1) ?? 0)
  );
}

export const POOL_ROTATION_RULES: readonly CelRule<RotationView>[] = [
  {
    // A string that is no duration is the pattern's error alone: the guard keeps duration() from
    // failing, which the API server would report as a rule evaluation error on spec.rotation.
    rule: `self.maxAge == '' || !self.maxAge.matches('${DURATION_PATTERN}') || duration(self.maxAge) >= duration('${MIN_MAX_AGE_SECONDS}s')`,
    message: `maxAge must be at least ${MIN_MAX_AGE_SECONDS}s`,
    fieldPath: '.maxAge',
    reason: 'FieldValueInvalid',
    holds: (r) => {
      const seconds = r.maxAge === undefined ? Number.NaN : durationSeconds(r.maxAge);
      return Number.isNaN(seconds) || seconds >= MIN_MAX_AGE_SECONDS;
    },
  },
];

/** Where each pool rule set sits (dotted from the object root), for the CEL tests. */
export const POOL_RULE_LOCATIONS = {
  'metadata.name': POOL_NAME_RULES,
  spec: POOL_SPEC_RULES,
  'spec.rollingUpdate': POOL_ROLLING_RULES,
  'spec.rotation': POOL_ROTATION_RULES,
} as const;

function apply<T>(
  location: string,
  rules: readonly CelRule<T>[],
  self: T | undefined,
  out: FieldError[],
): void {
  if (self === undefined) return;
  for (const r of rules) {
    if (r.transition) continue;
    if (!r.holds(self))
      out.push({ path: r.fieldPath ? `${location}${r.fieldPath}` : location, message: r.message });
  }
}

/**
 * Every rule of a schema-valid, defaulted pool spec: the pool's own, then the Proxy rules on the
 * template (with `oldSpec`'s template for the transition rules, as the API server runs them).
 */
export function checkProxyPoolRules(
  pool: PoolView & { spec: PoolSpecView },
  oldSpec?: PoolSpecView,
): FieldError[] {
  const out: FieldError[] = [];
  const spec = pool.spec;
  apply('metadata.name', POOL_NAME_RULES, pool.metadata?.name ?? '', out);
  apply('spec', POOL_SPEC_RULES, spec, out);
  apply('spec.rollingUpdate', POOL_ROLLING_RULES, spec.rollingUpdate, out);
  apply('spec.rotation', POOL_ROTATION_RULES, spec.rotation, out);
  const tmpl = spec.template?.spec;
  if (tmpl) {
    for (const e of checkProxyRules(tmpl, oldSpec?.template?.spec)) {
      out.push({ path: `spec.template.${e.path}`, message: e.message });
    }
  }
  return out;
}
