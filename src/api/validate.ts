/**
 * api/validate — admission for Proxy, ProxyPool and ProviderHealth objects outside a cluster: applies the
 * schema defaults, checks the JSON schema (unknown spec fields rejected), the object's identity
 * and the cross-field rules of api/rules — the same verdicts the API server gives with the
 * generated CRD, so a manifest accepted in standalone mode is accepted by a cluster and back.
 */
import { Compile } from 'typebox/compile';
import Value from 'typebox/value';
import { API_VERSION, PROVIDER_HEALTH_KIND, PROXY_KIND, PROXY_POOL_KIND } from './constants.ts';
import { checkProxyPoolRules } from './pool-rules.ts';
import { type ProviderHealth, ProviderHealthSchema } from './providerhealth.ts';
import { type ProxyObject, ProxySchema, type ProxySpec } from './proxy.ts';
import { type ProxyPool, ProxyPoolSchema, type ProxyPoolSpec } from './proxypool.ts';
import { checkProxyRules } from './rules.ts';
import { type FieldError, schemaErrors } from './schema-errors.ts';

export { type FieldError, formatFieldErrors } from './schema-errors.ts';

/**
 * `rulesSkipped`: a schema error kept the cross-field rules from running (the API server's "some
 * validation rules were not checked because the object was invalid"), so fixing the errors shown
 * may reveal more.
 */
export type ValidationResult<T> =
  | { ok: true; value: T }
  | { ok: false; errors: FieldError[]; rulesSkipped?: boolean };

const proxyValidator = Compile(ProxySchema);
const providerHealthValidator = Compile(ProviderHealthSchema);
const proxyPoolValidator = Compile(ProxyPoolSchema);

const DNS1123_LABEL = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;
const DNS1123_SUBDOMAIN = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;

/** Kubernetes' rule for most object names: lower-case DNS subdomain, at most 253 characters. */
export function isDnsSubdomain(name: string): boolean {
  return name.length <= 253 && DNS1123_SUBDOMAIN.test(name);
}
/** Kubernetes' rule for namespaces (and Service names): DNS label, at most 63 characters. */
export function isDnsLabel(name: string): boolean {
  return name.length <= 63 && DNS1123_LABEL.test(name);
}

function isRecord(v: unknown): v is Record<string, unknown> {
  return v !== null && typeof v === 'object' && !Array.isArray(v);
}

/**
 * The schema errors that keep the API server from evaluating a CRD's CEL rules: a missing
 * required field, a value of the wrong type, one outside an enum, and a string or list over its
 * maximum size. Anything else (a range, a pattern, a bad name, an unknown field) still lets
 * every rule run, and the server reports the rules' errors beside the schema's.
 */
const RULE_BLOCKING_KEYWORDS = new Set([
  'required',
  'type',
  'enum',
  'const',
  'anyOf',
  'oneOf',
  'maxLength',
  'maxItems',
  'maxProperties',
]);

function blocksRules(errors: Iterable<{ keyword: string }>): boolean {
  for (const e of errors) if (RULE_BLOCKING_KEYWORDS.has(e.keyword)) return true;
  return false;
}

function identityErrors(
  obj: Record<string, unknown>,
  kind: string,
  scope: 'Namespaced' | 'Cluster',
): FieldError[] {
  const errors: FieldError[] = [];
  if (obj.apiVersion !== undefined && obj.apiVersion !== API_VERSION) {
    errors.push({ path: 'apiVersion', message: `must be ${API_VERSION}` });
  }
  if (obj.kind !== undefined && obj.kind !== kind) errors.push({ path: 'kind', message: `must be ${kind}` });
  const meta = obj.metadata;
  if (!isRecord(meta)) return errors;
  const { name, namespace } = meta;
  if (typeof name === 'string' && !isDnsSubdomain(name)) {
    errors.push({
      path: 'metadata.name',
      message:
        'must be a DNS subdomain: lower-case letters, digits, "-" and ".", starting and ending alphanumeric, at most 253 characters',
    });
  }
  if (scope === 'Namespaced' && typeof namespace === 'string' && !isDnsLabel(namespace)) {
    errors.push({
      path: 'metadata.namespace',
      message:
        'must be a DNS label: lower-case letters, digits and "-", starting and ending alphanumeric, at most 63 characters',
    });
  }
  if (scope === 'Cluster' && namespace !== undefined && namespace !== '') {
    errors.push({ path: 'metadata.namespace', message: `must be empty: ${kind} is cluster-scoped` });
  }
  return errors;
}

/** Fills in what the API server would default (spec.type, spec.port); never mutates `obj`. */
export function defaultProxy<T>(obj: T): T {
  return Value.Default(ProxySchema, structuredClone(obj)) as T;
}

/**
 * Validates a Proxy as the API server would with the generated CRD, after applying defaults.
 * `opts.old` is the stored object on update (enables the transition rules, e.g. type
 * immutability). On success `value` is the defaulted copy.
 */
export function validateProxy(obj: unknown, opts: { old?: ProxyObject } = {}): ValidationResult<ProxyObject> {
  if (!isRecord(obj)) return { ok: false, errors: [{ path: '', message: 'must be an object' }] };
  const value = defaultProxy(obj);
  const raw = [...proxyValidator.Errors(value)];
  const errors = [
    ...identityErrors(value, PROXY_KIND, 'Namespaced'),
    ...schemaErrors(value, raw, [], ProxySchema),
  ];
  // Rules read fields of the right type and shape, as CEL does: only then do they run.
  const rulesSkipped = blocksRules(raw);
  if (!rulesSkipped) {
    const spec = value.spec as ProxySpec;
    const oldSpec = opts.old ? (defaultProxy(opts.old).spec as ProxySpec | undefined) : undefined;
    errors.push(...checkProxyRules(spec, oldSpec));
  }
  return result(value as ProxyObject, errors, rulesSkipped);
}

function result<T>(value: T, errors: FieldError[], rulesSkipped: boolean): ValidationResult<T> {
  if (errors.length === 0) return { ok: true, value };
  return rulesSkipped ? { ok: false, errors, rulesSkipped } : { ok: false, errors };
}

/** Fills in what the API server would default (replicas, limits, the template's type and port). */
export function defaultProxyPool<T>(obj: T): T {
  return Value.Default(ProxyPoolSchema, structuredClone(obj)) as T;
}

/** Validates a ProxyPool as the API server would with the generated CRD, after applying defaults. */
export function validateProxyPool(obj: unknown, opts: { old?: ProxyPool } = {}): ValidationResult<ProxyPool> {
  if (!isRecord(obj)) return { ok: false, errors: [{ path: '', message: 'must be an object' }] };
  const value = defaultProxyPool(obj);
  const raw = [...proxyPoolValidator.Errors(value)];
  const errors = [
    ...identityErrors(value, PROXY_POOL_KIND, 'Namespaced'),
    ...schemaErrors(value, raw, [], ProxyPoolSchema),
  ];
  const rulesSkipped = blocksRules(raw);
  if (!rulesSkipped) {
    const oldSpec = opts.old ? (defaultProxyPool(opts.old).spec as ProxyPoolSpec | undefined) : undefined;
    errors.push(...checkProxyPoolRules(value as { spec: ProxyPoolSpec }, oldSpec));
  }
  return result(value as ProxyPool, errors, rulesSkipped);
}

/** Validates a ProviderHealth object (status only, cluster-scoped). */
export function validateProviderHealth(obj: unknown): ValidationResult<ProviderHealth> {
  if (!isRecord(obj)) return { ok: false, errors: [{ path: '', message: 'must be an object' }] };
  const value = structuredClone(obj);
  const errors = [
    ...identityErrors(value, PROVIDER_HEALTH_KIND, 'Cluster'),
    ...schemaErrors(value, providerHealthValidator.Errors(value), [], ProviderHealthSchema),
  ];
  return errors.length === 0 ? { ok: true, value: value as ProviderHealth } : { ok: false, errors };
}
