/**
 * test/unit/api/proxypool — the ProxyPool's admission in both places it happens: the standalone
 * validator (api/validate) and the CEL rules of the generated CRD, evaluated with a real CEL
 * engine at their schema locations, against one table of pools. Each bad pool is refused with
 * an error naming the field, and both agree on which fields.
 */
import { isCelError, run } from '@bufbuild/cel';
import { describe, expect, it } from 'vitest';
import { proxyPoolCrd } from '../../../src/api/crd.ts';
import type { ProxyPool } from '../../../src/api/proxypool.ts';
import { defaultProxyPool, validateProxyPool } from '../../../src/api/validate.ts';
import { basePool, POOL_CASES, POOL_SCHEMA_CASES } from '../../support/api/pool-manifests.ts';

type Node = Record<string, unknown>;

interface Located {
  location: string[];
  rule: string;
  fieldPath?: string;
}

function collect(schema: Node, location: string[] = []): Located[] {
  const out: Located[] = [];
  for (const v of (schema['x-kubernetes-validations'] as Located[] | undefined) ?? []) {
    out.push({ location, rule: v.rule, ...(v.fieldPath ? { fieldPath: v.fieldPath } : {}) });
  }
  for (const [name, child] of Object.entries((schema.properties as Record<string, Node> | undefined) ?? {})) {
    out.push(...collect(child, [...location, name]));
  }
  return out;
}

function toCel(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(toCel);
  if (value !== null && typeof value === 'object')
    return new Map(Object.entries(value).map(([k, v]) => [k, toCel(v)]));
  if (typeof value === 'number' && Number.isInteger(value)) return BigInt(value);
  return value;
}

const crd = proxyPoolCrd() as { spec: { versions: { schema: { openAPIV3Schema: Node } }[] } };
const rules = collect(crd.spec.versions[0]?.schema.openAPIV3Schema as Node);

function at(obj: unknown, location: string[]): unknown {
  let cur = obj;
  for (const seg of location) cur = (cur as Node | undefined)?.[seg];
  return cur;
}

/**
 * Paths CEL blames on a defaulted object; transition rules run only on an update (`old`), where
 * both values exist, as the API server runs them.
 */
function celFailures(obj: unknown, old?: unknown): string[] {
  const out: string[] = [];
  for (const r of rules) {
    const self = at(obj, r.location);
    if (self === undefined) continue;
    const bindings: Record<string, unknown> = { self: toCel(self) };
    if (/\boldSelf\b/.test(r.rule)) {
      const oldSelf = old === undefined ? undefined : at(old, r.location);
      if (oldSelf === undefined) continue;
      bindings.oldSelf = toCel(oldSelf);
    }
    const result = run(r.rule, bindings as never);
    if (isCelError(result)) throw new Error(`${r.rule}: ${result.message}`);
    if (result === false) out.push(`${r.location.join('.')}${r.fieldPath ?? ''}`.replace(/^\./, ''));
  }
  return out.sort();
}

describe('ProxyPool admission', () => {
  it.each(POOL_CASES)('$name: the validator and the CRD CEL rules agree', ({ obj, old, errors }) => {
    const result = validateProxyPool(obj, old ? { old: old as unknown as ProxyPool } : {});
    expect(result.ok ? [] : result.errors.map((e) => e.path).sort()).toEqual([...errors].sort());
    const stored = old ? defaultProxyPool(old) : undefined;
    expect(celFailures(defaultProxyPool(obj), stored)).toEqual([...errors].sort());
  });

  it.each(POOL_SCHEMA_CASES)('$name is refused naming exactly $errors', ({ obj, errors }) => {
    const result = validateProxyPool(obj);
    expect(result.ok).toBe(false);
    if (!result.ok) expect([...new Set(result.errors.map((e) => e.path))].sort()).toEqual([...errors].sort());
    // CEL evaluates cleanly (no rule errors out on a malformed value) and blames no other field.
    for (const f of celFailures(defaultProxyPool(obj))) expect(errors).toContain(f);
  });

  it('defaults the rolling limits, the rotation and the template like the API server', () => {
    const obj = basePool();
    obj.spec.rollingUpdate = {};
    obj.spec.rotation = { maxAge: '1h' };
    const result = validateProxyPool(obj);
    expect(result.ok).toBe(true);
    if (!result.ok) return;
    expect(result.value.spec.rollingUpdate).toEqual({ maxSurge: 1, maxUnavailable: 0 });
    expect(result.value.spec.rotation).toEqual({ maxAge: '1h', jitter: 0.1, strategy: 'Replace' });
    expect(result.value.spec.template.spec).toMatchObject({ type: 'Managed', port: 3128 });
  });
});
