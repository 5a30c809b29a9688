/**
 * test/unit/api/cel — evaluates every CEL rule of the *generated* Proxy CRD with a real CEL engine,
 * at its schema location with `self` (and `oldSelf` for transition rules) bound the way the API
 * server binds them, against the shared manifest table. A wrong CEL expression fails here, and
 * so does any disagreement with the TypeScript twin that standalone mode enforces.
 */

import type { CelInput } from '@bufbuild/cel';
import { isCelError, run } from '@bufbuild/cel';
import { describe, expect, it } from 'vitest';
import { proxyCrd } from '../../../src/api/crd.ts';
import type { ProxyObject } from '../../../src/api/proxy.ts';
import { checkProxyRules, PROXY_RULE_LOCATIONS, rulePath, type XValidation } from '../../../src/api/rules.ts';
import { defaultProxy, validateProxy } from '../../../src/api/validate.ts';
import { PROXY_CASES } from '../../support/api/manifests.ts';

interface LocatedRule {
  location: string[];
  validation: XValidation;
  /** The schema node the rule is attached to. */
  node: Record<string, unknown>;
}

type Node = Record<string, unknown>;

function collectRules(schema: Node, location: string[] = []): LocatedRule[] {
  const out: LocatedRule[] = [];
  for (const v of (schema['x-kubernetes-validations'] as XValidation[] | undefined) ?? []) {
    out.push({ location, validation: v, node: schema });
  }
  for (const [name, child] of Object.entries((schema.properties as Record<string, Node> | undefined) ?? {})) {
    out.push(...collectRules(child, [...location, name]));
  }
  for (const key of ['items', 'additionalProperties']) {
    const child = schema[key] as Node | undefined;
    // Rules under lists or maps would need per-element binding, which this harness lacks.
    if (child && collectRules(child).length > 0)
      throw new Error(`rule under ${key} at ${location.join('.')}`);
  }
  return out;
}

function openApiSchema(): Node {
  const crd = proxyCrd() as { spec: { versions: { schema: { openAPIV3Schema: Node } }[] } };
  return crd.spec.versions[0]!.schema.openAPIV3Schema;
}

/** JSON → CEL input as the API server sees it: objects are maps, integers are int (BigInt). */
function toCel(value: unknown): CelInput {
  if (Array.isArray(value)) return value.map(toCel);
  if (value !== null && typeof value === 'object') {
    return new Map(Object.entries(value).map(([k, v]) => [k, toCel(v)]));
  }
  if (typeof value === 'number' && Number.isInteger(value)) return BigInt(value);
  return value as CelInput;
}

function at(obj: unknown, path: readonly string[]): unknown {
  let cur = obj;
  for (const seg of path) {
    if (cur === null || typeof cur !== 'object') return undefined;
    cur = (cur as Node)[seg];
  }
  return cur;
}

const isTransition = (rule: string) => /\boldSelf\b/.test(rule);

interface Evaluation {
  path: string;
  rule: string;
  result: boolean;
}

/** Every rule that applies to `obj`, evaluated; throws on a CEL error or a non-boolean result. */
function evaluate(rules: LocatedRule[], obj: unknown, old?: unknown): Evaluation[] {
  const out: Evaluation[] = [];
  for (const { location, validation } of rules) {
    const self = at(obj, location);
    if (self === undefined) continue;
    const bindings: Record<string, CelInput> = { self: toCel(self) };
    if (isTransition(validation.rule)) {
      const oldSelf = old === undefined ? undefined : at(old, location);
      if (oldSelf === undefined) continue;
      bindings.oldSelf = toCel(oldSelf);
    }
    const result = run(validation.rule, bindings);
    if (isCelError(result)) throw new Error(`${validation.rule}: ${result.message}`);
    if (typeof result !== 'boolean') throw new Error(`${validation.rule} returned ${String(result)}`);
    out.push({ path: rulePath(location.join('.'), validation), rule: validation.rule, result });
  }
  return out;
}

const rules = collectRules(openApiSchema());

describe('CRD CEL rules', () => {
  it('are exactly the rules of api/rules, at the same locations', () => {
    const fromCrd = rules.map((r) => `${r.location.join('.')}: ${r.validation.rule}`).sort();
    const fromTable = Object.entries(PROXY_RULE_LOCATIONS)
      .flatMap(([loc, list]) => list.map((r) => `${loc}: ${r.rule}`))
      .sort();
    expect(fromCrd).toEqual(fromTable);
  });

  it('reference only fields their schema declares (the API server type-checks this)', () => {
    for (const { node, validation } of rules) {
      const declared = Object.keys((node.properties as Record<string, unknown> | undefined) ?? {});
      for (const [, field] of validation.rule.matchAll(/\b(?:self|oldSelf)\.([A-Za-z_]\w*)/g)) {
        expect(declared, validation.rule).toContain(field);
      }
      if (validation.fieldPath) expect(declared).toContain(validation.fieldPath.slice(1));
    }
  });

  describe.each(PROXY_CASES)('$name', ({ obj, old, errors }) => {
    // The API server defaults before it validates, the stored object included.
    const current = defaultProxy(obj);
    const stored = old ? defaultProxy(old) : undefined;
    const failures = () =>
      evaluate(rules, current, stored)
        .filter((e) => !e.result)
        .map((e) => e.path)
        .sort();

    it('CEL agrees with the TypeScript rules', () => {
      const spec = (current as Node).spec as Node | undefined;
      const ts = spec ? checkProxyRules(spec, (stored as Node | undefined)?.spec as Node | undefined) : [];
      expect(failures()).toEqual(ts.map((e) => e.path).sort());
    });

    it('CEL blames the fields the table expects', () => {
      const ruleMessages = new Set(rules.map((r) => r.validation.message));
      const result = validateProxy(obj, old ? { old: old as ProxyObject } : {});
      // The API server skips every rule after a blocking schema error (a wrong type, an enum,
      // a missing field, an over-long value), and so does the validator; else both run them all.
      const skipped = !result.ok && result.rulesSkipped === true;
      const blamed = result.ok
        ? []
        : [...new Set(result.errors.filter((e) => ruleMessages.has(e.message)).map((e) => e.path))];
      expect(skipped ? [] : [...new Set(failures())]).toEqual(blamed.sort());
      for (const path of blamed) expect(errors).toContain(path);
    });
  });

  it('every rule both passes and fails somewhere in the table', () => {
    const seen = new Map<string, Set<boolean>>();
    for (const c of PROXY_CASES) {
      const evals = evaluate(rules, defaultProxy(c.obj), c.old ? defaultProxy(c.old) : undefined);
      for (const e of evals) {
        const key = `${e.path} ${e.rule}`;
        seen.set(key, (seen.get(key) ?? new Set()).add(e.result));
      }
    }
    for (const r of rules) {
      const key = `${rulePath(r.location.join('.'), r.validation)} ${r.validation.rule}`;
      expect([...(seen.get(key) ?? [])].sort(), key).toEqual([false, true]);
    }
  });
});
