/**
 * test/unit/api/crd — the checked-in CRDs are exactly what `npm run generate` writes, they are
 * structural schemas the API server accepts, and the samples shipped next to them validate.
 */
import { readFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Compile } from 'typebox/compile';
import { describe, expect, it } from 'vitest';
import { parse } from 'yaml';
import { providerHealthCrd, proxyCrd, renderCrdFiles, toStructural } from '../../../src/api/crd.ts';
import type { ProxyObject } from '../../../src/api/proxy.ts';
import { PROXY_RULE_LOCATIONS } from '../../../src/api/rules.ts';
import { defaultProxy, formatFieldErrors, validateProxy } from '../../../src/api/validate.ts';
import { PROXY_CASES } from '../../support/api/manifests.ts';

const root = join(dirname(fileURLToPath(import.meta.url)), '../../..');

type Node = Record<string, unknown>;

/** The structural-schema rules of apiextensions.k8s.io/v1 that a converter could break. */
function structuralProblems(schema: Node, at = ''): string[] {
  const problems: string[] = [];
  const typed = typeof schema.type === 'string';
  if (!typed && schema['x-kubernetes-preserve-unknown-fields'] !== true) problems.push(`${at}: no type`);
  for (const k of ['anyOf', 'oneOf', 'allOf', 'not', '$ref', 'patternProperties', 'const', '$id']) {
    if (k in schema) problems.push(`${at}: ${k}`);
  }
  if (schema.properties && schema.additionalProperties !== undefined) {
    problems.push(`${at}: properties together with additionalProperties`);
  }
  if (schema.additionalProperties === false) problems.push(`${at}: additionalProperties false`);
  for (const [name, child] of Object.entries((schema.properties as Record<string, Node>) ?? {})) {
    problems.push(...structuralProblems(child, `${at}.${name}`));
  }
  if (schema.items) problems.push(...structuralProblems(schema.items as Node, `${at}[]`));
  if (schema.additionalProperties && typeof schema.additionalProperties === 'object') {
    problems.push(...structuralProblems(schema.additionalProperties as Node, `${at}.*`));
  }
  if (schema.type === 'array' && schema['x-kubernetes-list-type'] === 'map') {
    const keys = schema['x-kubernetes-list-map-keys'] as string[];
    const required = ((schema.items as Node).required as string[]) ?? [];
    for (const k of keys) if (!required.includes(k)) problems.push(`${at}: map key ${k} not required`);
  }
  return problems;
}

function version(crd: Node): Node {
  return ((crd.spec as Node).versions as Node[])[0]!;
}

describe('generated CRDs', () => {
  it('match the checked-in files (run `npm run generate` after changing src/api)', async () => {
    for (const [path, content] of Object.entries(renderCrdFiles())) {
      const onDisk = await readFile(join(root, path), 'utf8').catch(() => '<missing>');
      expect(onDisk, path).toBe(content);
    }
  });

  it('render the same bytes every time', () => {
    expect(renderCrdFiles()).toEqual(renderCrdFiles());
  });

  it.each([
    ['Proxy', proxyCrd()],
    ['ProviderHealth', providerHealthCrd()],
  ])('%s has a structural schema', (_kind, crd) => {
    const schema = (version(crd).schema as Node).openAPIV3Schema as Node;
    expect(structuralProblems(schema)).toEqual([]);
    expect((schema.properties as Node).metadata).toEqual({ type: 'object' });
  });

  it('Proxy: namespaced, px, status subresource, printer columns, immutable type', () => {
    const crd = proxyCrd() as Node;
    const spec = crd.spec as Node;
    expect(spec.scope).toBe('Namespaced');
    expect((spec.names as Node).shortNames).toEqual(['px']);
    expect((spec.names as Node).categories).toEqual(['crawl']);
    const v = version(crd);
    expect(v.subresources).toEqual({ status: {} });
    const columns = v.additionalPrinterColumns as Node[];
    expect(columns.map((c) => c.name)).toEqual([
      'Type',
      'Provider',
      'Phase',
      'Address',
      'Healthy',
      'Zone',
      'Age',
    ]);
    // Where it runs, in `kubectl get px -o wide` only.
    expect(columns.find((c) => c.name === 'Zone')).toMatchObject({
      jsonPath: '.status.location.zone',
      priority: 1,
    });
    expect(columns.find((c) => c.name === 'Healthy')?.jsonPath).toBe(
      '.status.conditions[?(@.type=="Healthy")].status',
    );
    const specSchema = ((v.schema as Node).openAPIV3Schema as { properties: { spec: Node } }).properties.spec;
    const type = (specSchema.properties as Record<string, Node>).type!;
    expect(type.default).toBe('Managed');
    expect(type['x-kubernetes-validations']).toEqual([expect.objectContaining({ rule: 'self == oldSelf' })]);
    expect((specSchema.properties as Record<string, Node>).port!.default).toBe(3128);
  });

  it('ProviderHealth: cluster-scoped, ph, printer columns', () => {
    const crd = providerHealthCrd() as Node;
    const spec = crd.spec as Node;
    expect(spec.scope).toBe('Cluster');
    expect((spec.names as Node).shortNames).toEqual(['ph']);
    const columns = version(crd).additionalPrinterColumns as Node[];
    expect(columns.map((c) => `${c.name}:${c.type}`)).toEqual([
      'Type:string',
      'Ready:string',
      'Targets:string',
      'Last Check:date',
      'Age:date',
    ]);
  });

  it('refuses schema constructs Kubernetes would reject', () => {
    expect(() => toStructural({ anyOf: [{ type: 'string' }, { type: 'integer' }] })).toThrow(/anyOf/);
    expect(() => toStructural({ properties: {} })).toThrow(/type/);
    expect(() => toStructural({ type: 'object', $ref: '#/x' })).toThrow(/\$ref/);
  });
});

describe('samples', () => {
  it.each([
    'config/samples/proxy_managed.yaml',
    'config/samples/proxy_external.yaml',
    'examples/standalone/proxies/local-1.yaml',
    'examples/standalone/proxies/local-2.yaml',
  ])('%s is a valid Proxy', async (file) => {
    const obj = parse(await readFile(join(root, file), 'utf8'));
    const result = validateProxy(obj);
    expect(result.ok ? '' : formatFieldErrors(result.errors)).toBe('');
  });
});

describe('CRD openAPIV3Schema against the manifest table', () => {
  const schema = (version(proxyCrd()).schema as Node).openAPIV3Schema as Node;
  const crdValidator = Compile(schema as Parameters<typeof Compile>[0]);
  const ruleMessages = new Set<string>(
    Object.values(PROXY_RULE_LOCATIONS).flatMap((rules) => rules.map((r) => r.message)),
  );
  const apiServerChecks = (path: string, message: string) =>
    // What the converted schema is not meant to catch: identity (the API server checks names
    // itself), unknown fields (pruned, not rejected) and the CEL rules (tested in cel.test.ts).
    !/^(metadata|kind|apiVersion)/.test(path) &&
    !message.startsWith('unknown field') &&
    !ruleMessages.has(message);

  it.each(PROXY_CASES)('$name', ({ obj, old }) => {
    const runtime = validateProxy(obj, old ? { old: old as ProxyObject } : {});
    const shapeErrors = runtime.ok ? [] : runtime.errors.filter((e) => apiServerChecks(e.path, e.message));
    const crdErrors = crdValidator.Errors(defaultProxy(obj));
    if (shapeErrors.length === 0) expect(crdErrors).toEqual([]);
    else expect(crdErrors.length).toBeGreaterThan(0);
  });
});
