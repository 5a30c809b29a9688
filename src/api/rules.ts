/**
 * api/rules — the Proxy's cross-field rules, each written twice side by side: as the CEL
 * expression the CRD carries in `x-kubernetes-validations` (enforced by the API server) and as a
 * TypeScript predicate (enforced by standalone mode through api/validate). Keeping both in one
 * table makes drift visible in review; test/unit/api evaluates both against one set of manifests.
 */
import { DEFAULT_FAILURE_THRESHOLD, DEFAULT_INTERVAL_SECONDS } from './health-defaults.ts';
import type { FieldError } from './schema-errors.ts';

/** The `x-kubernetes-validations` entry as apiextensions.k8s.io/v1 stores it. */
export interface XValidation {
  rule: string;
  message: string;
  fieldPath?: string;
  reason?: 'FieldValueInvalid' | 'FieldValueForbidden' | 'FieldValueRequired' | 'FieldValueDuplicate';
}

/** A rule at one schema location; `self` is the value there, `oldSelf` the stored one (updates). */
export interface CelRule<T> extends XValidation {
  /** Transition rule: only evaluated on update, when both self and oldSelf exist. */
  transition?: boolean;
  /** TypeScript twin of `rule`: true when the value is acceptable. */
  holds(self: T, oldSelf?: T): boolean;
}

/** The shapes the predicates read; structural so this module needs nothing from api/proxy. */
interface SpecView {
  type?: string;
  provider?: string;
  endpoint?: unknown;
  placement?: unknown;
  cloudInit?: unknown;
  healthCheck?: unknown;
  credentialsSecretRef?: unknown;
  credentialsRotation?: unknown;
}
interface CloudInitView {
  inline?: string;
  secretRef?: unknown;
}
interface HealthCheckView {
  intervalSeconds?: number;
  timeoutSeconds?: number;
  failureThreshold?: number;
}

const EXTERNAL = "(has(self.type) && self.type == 'External')";
const isExternal = (s: SpecView) => s.type === 'External';
const has = (v: unknown) => v !== undefined;

export const SPEC_RULES: readonly CelRule<SpecView>[] = [
  {
    rule: `!${EXTERNAL} || has(self.endpoint)`,
    message: 'endpoint is required when type is External',
    fieldPath: '.endpoint',
    reason: 'FieldValueRequired',
    holds: (s) => !isExternal(s) || has(s.endpoint),
  },
  {
    rule: `${EXTERNAL} || !has(self.endpoint)`,
    message:
      'endpoint is only allowed when type is External; a Managed proxy gets its address from the provider',
    fieldPath: '.endpoint',
    reason: 'FieldValueForbidden',
    holds: (s) => isExternal(s) || !has(s.endpoint),
  },
  {
    rule: `${EXTERNAL} || has(self.provider)`,
    message: 'provider is required when type is Managed (a name from the providers config)',
    fieldPath: '.provider',
    reason: 'FieldValueRequired',
    holds: (s) => isExternal(s) || has(s.provider),
  },
  {
    rule: `!${EXTERNAL} || !has(self.provider)`,
    message: 'provider is only allowed when type is Managed',
    fieldPath: '.provider',
    reason: 'FieldValueForbidden',
    holds: (s) => !isExternal(s) || !has(s.provider),
  },
  {
    rule: `!${EXTERNAL} || !has(self.placement)`,
    message: 'placement is only allowed when type is Managed',
    fieldPath: '.placement',
    reason: 'FieldValueForbidden',
    holds: (s) => !isExternal(s) || !has(s.placement),
  },
  {
    rule: `!${EXTERNAL} || !has(self.cloudInit)`,
    message: 'cloudInit is only allowed when type is Managed',
    fieldPath: '.cloudInit',
    reason: 'FieldValueForbidden',
    holds: (s) => !isExternal(s) || !has(s.cloudInit),
  },
  {
    rule: `!${EXTERNAL} || !has(self.credentialsRotation)`,
    message: 'credentialsRotation is only allowed when type is Managed',
    fieldPath: '.credentialsRotation',
    reason: 'FieldValueForbidden',
    holds: (s) => !isExternal(s) || !has(s.credentialsRotation),
  },
  {
    // The operator only rotates credentials it generated; a referenced Secret is the user's.
    rule: '!has(self.credentialsRotation) || !has(self.credentialsSecretRef)',
    message:
      'credentialsRotation applies to generated credentials only; rotate the Secret named by credentialsSecretRef yourself (the proxy is replaced when it changes)',
    fieldPath: '.credentialsRotation',
    reason: 'FieldValueForbidden',
    holds: (s) => !has(s.credentialsRotation) || !has(s.credentialsSecretRef),
  },
];

export const TYPE_RULES: readonly CelRule<string>[] = [
  {
    rule: 'self == oldSelf',
    message: 'type is immutable; delete the Proxy and create it again to change it',
    transition: true,
    holds: (self, oldSelf) => oldSelf === undefined || self === oldSelf,
  },
];

/**
 * The reconciler deletes a retiring instance through the proxy's *current* provider, so a
 * provider switch would strand the old instance (and its bill) in the old provider.
 */
export const PROVIDER_RULES: readonly CelRule<string>[] = [
  {
    rule: 'self == oldSelf',
    message: 'provider is immutable; delete the Proxy and create it again to move it to another provider',
    transition: true,
    holds: (self, oldSelf) => oldSelf === undefined || self === oldSelf,
  },
];

export const CLOUD_INIT_RULES: readonly CelRule<CloudInitView>[] = [
  {
    rule: 'has(self.inline) != has(self.secretRef)',
    message: 'exactly one of inline or secretRef must be set',
    holds: (c) => has(c.inline) !== has(c.secretRef),
  },
];

export const HEALTH_CHECK_RULES: readonly CelRule<HealthCheckView>[] = [
  {
    rule:
      '!has(self.timeoutSeconds) || self.timeoutSeconds < ' +
      `(has(self.intervalSeconds) ? self.intervalSeconds : ${DEFAULT_INTERVAL_SECONDS}) * ` +
      `(has(self.failureThreshold) ? self.failureThreshold : ${DEFAULT_FAILURE_THRESHOLD})`,
    message: `timeoutSeconds must be less than intervalSeconds × failureThreshold (defaults ${DEFAULT_INTERVAL_SECONDS} and ${DEFAULT_FAILURE_THRESHOLD})`,
    fieldPath: '.timeoutSeconds',
    reason: 'FieldValueInvalid',
    holds: (h) =>
      h.timeoutSeconds === undefined ||
      h.timeoutSeconds <
        (h.intervalSeconds ?? DEFAULT_INTERVAL_SECONDS) * (h.failureThreshold ?? DEFAULT_FAILURE_THRESHOLD),
  },
];

/** Where each rule set sits in the Proxy schema (dotted from the object root). */
export const PROXY_RULE_LOCATIONS = {
  spec: SPEC_RULES,
  'spec.type': TYPE_RULES,
  'spec.provider': PROVIDER_RULES,
  'spec.cloudInit': CLOUD_INIT_RULES,
  'spec.healthCheck': HEALTH_CHECK_RULES,
} as const;

/** The data half of a rule set, for the schema's `x-kubernetes-validations`. */
export function celValidations<T>(rules: readonly CelRule<T>[]): XValidation[] {
  return rules.map(({ rule, message, fieldPath, reason }) => ({
    rule,
    message,
    ...(fieldPath ? { fieldPath } : {}),
    ...(reason ? { reason } : {}),
  }));
}

/** The path an error of `rule` at `location` blames, as the API server reports it. */
export function rulePath(location: string, rule: XValidation): string {
  return rule.fieldPath ? `${location}${rule.fieldPath}` : location;
}

function apply<T>(
  location: string,
  rules: readonly CelRule<T>[],
  self: T | undefined,
  oldSelf: T | undefined,
  out: FieldError[],
): void {
  if (self === undefined) return;
  for (const r of rules) {
    // Like the API server: a transition rule runs only when both values exist.
    if (r.transition && oldSelf === undefined) continue;
    if (!r.holds(self, oldSelf)) out.push({ path: rulePath(location, r), message: r.message });
  }
}

/**
 * Runs every cross-field rule against a schema-valid, defaulted spec (and the stored spec on
 * update). Returns one error per broken rule, in table order.
 */
export function checkProxyRules(spec: SpecView, oldSpec?: SpecView): FieldError[] {
  const out: FieldError[] = [];
  apply('spec', SPEC_RULES, spec, oldSpec, out);
  apply('spec.type', TYPE_RULES, spec.type, oldSpec?.type, out);
  apply('spec.provider', PROVIDER_RULES, spec.provider, oldSpec?.provider, out);
  apply('spec.cloudInit', CLOUD_INIT_RULES, spec.cloudInit as CloudInitView | undefined, undefined, out);
  apply(
    'spec.healthCheck',
    HEALTH_CHECK_RULES,
    spec.healthCheck as HealthCheckView | undefined,
    undefined,
    out,
  );
  return out;
}
