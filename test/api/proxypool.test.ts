/**
 * test/api/proxypool — the ProxyPool's admission in both places it happens: the standalone
 * validator (api/validate) and the CEL rules of the generated CRD, evaluated with a real CEL
 * engine at their schema locations, against one table of pools. Each bad pool is refused with
 * an error naming the field, and both agree on which fields.
 */
import { isCelError, run } from '@bufbuild/cel';
import { describe, expect, it } from 'vitest';
import { proxyPoolCrd } from '../../src/api/crd.ts';
import { defaultProxyPool, validateProxyPool } from '../../src/api/validate.ts';

type Node = Record<string, unknown>;

const base = () => ({
  apiVersion: 'crawl.example.com/v1alpha1',
  kind: 'ProxyPool',
  metadata: { name: 'eu', namespace: 'crawl' },
  spec: {
    replicas: 3,
    template: { metadata: { labels: { tier: 'a' } }, spec: { provider: 'local' } },
  } as Node,
});

const CASES: { name: string; edit: (spec: Node, meta: Node) => void; errors: string[] }[] = [
  { name: 'a minimal pool', edit: () => {}, errors: [] },
  {
    name: 'a name too long for the pool label',
    edit: (_s, m) => {
      m.name = 'p'.repeat(64);
    },
    errors: ['metadata.name'],
  },
  {
    name: 'rolling limits and rotation',
    edit: (s) => {
      s.rollingUpdate = { maxSurge: 2, maxUnavailable: 1 };
      s.rotation = { maxAge: '1h30m', jitter: 0.2, strategy: 'Replace' };
    },
    errors: [],
  },
  {
    name: 'an External template',
    edit: (s) => {
      s.template = { spec: { type: 'External', endpoint: { host: 'p.example', port: 3128 } } };
    },
    errors: ['spec.template.spec.type'],
  },
  {
    name: 'a template without provider',
    edit: (s) => {
      s.template = { spec: {} };
    },
    errors: ['spec.template.spec.provider'],
  },
  {
    name: 'maxSurge and maxUnavailable both 0',
    edit: (s) => {
      s.rollingUpdate = { maxSurge: 0, maxUnavailable: 0 };
    },
    errors: ['spec.rollingUpdate.maxSurge'],
  },
  {
    name: 'rotation strategy Restart without maxUnavailable',
    edit: (s) => {
      s.rotation = { maxAge: '1h', strategy: 'Restart' };
    },
    errors: ['spec.rollingUpdate.maxUnavailable'],
  },
  {
    name: 'rotation strategy Restart with maxUnavailable 0',
    edit: (s) => {
      s.rotation = { maxAge: '1h', strategy: 'Restart' };
      s.rollingUpdate = { maxSurge: 1, maxUnavailable: 0 };
    },
    errors: ['spec.rollingUpdate.maxUnavailable'],
  },
  {
    name: 'rotation strategy Restart with maxUnavailable 1',
    edit: (s) => {
      s.rotation = { maxAge: '1h', strategy: 'Restart' };
      s.rollingUpdate = { maxUnavailable: 1 };
    },
    errors: [],
  },
  {
    name: 'maxAge under 10s',
    edit: (s) => {
      s.rotation = { maxAge: '5s' };
    },
    errors: ['spec.rotation.maxAge'],
  },
];

const SCHEMA_CASES: { name: string; patch: Node; path: string }[] = [
  { name: 'negative replicas', patch: { replicas: -1 }, path: 'spec.replicas' },
  {
    name: 'a maxAge that is no duration',
    patch: { rotation: { maxAge: '1 day' } },
    path: 'spec.rotation.maxAge',
  },
  {
    name: 'an unknown strategy',
    patch: { rotation: { maxAge: '1h', strategy: 'Reboot' } },
    path: 'spec.rotation.strategy',
  },
  { name: 'jitter of 1', patch: { rotation: { maxAge: '1h', jitter: 1 } }, path: 'spec.rotation.jitter' },
  { name: 'an unknown field', patch: { replica: 3 }, path: 'spec.replica' },
];

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

/** Paths CEL blames on a defaulted create (transition rules need an old object, so they are skipped). */
function celFailures(obj: unknown): string[] {
  const out: string[] = [];
  for (const r of rules) {
    if (/\boldSelf\b/.test(r.rule)) continue;
    let self: unknown = obj;
    for (const seg of r.location) self = (self as Node | undefined)?.[seg];
    if (self === undefined) continue;
    const result = run(r.rule, { self: toCel(self) as never });
    if (isCelError(result)) throw new Error(`${r.rule}: ${result.message}`);
    if (result === false) out.push(`${r.location.join('.')}${r.fieldPath ?? ''}`.replace(/^\./, ''));
  }
  return out.sort();
}

describe('ProxyPool admission', () => {
  it.each(CASES)('$name: the validator and the CRD CEL rules agree', ({ edit, errors }) => {
    const obj = base();
    edit(obj.spec, obj.metadata);
    const result = validateProxyPool(obj);
    expect(result.ok ? [] : result.errors.map((e) => e.path).sort()).toEqual([...errors].sort());
    expect(celFailures(defaultProxyPool(obj))).toEqual([...errors].sort());
  });

  it.each(SCHEMA_CASES)('$name is refused naming $path', ({ patch, path }) => {
    const obj = base();
    Object.assign(obj.spec, patch);
    const result = validateProxyPool(obj);
    expect(result.ok).toBe(false);
    if (!result.ok) expect(result.errors.map((e) => e.path)).toContain(path);
  });

  it('defaults the rolling limits, the rotation and the template like the API server', () => {
    const obj = base();
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
