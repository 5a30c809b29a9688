/**
 * test/unit/api/schema-errors — the nearest known field that every validator names beside an
 * unknown one: the ranking (same name written differently, a typo, a prefix), the cases that get
 * no suggestion, the schema lookup, and the messages of the Proxy and ProxyPool validators.
 */
import { Type } from 'typebox';
import { Compile } from 'typebox/compile';
import { describe, expect, it } from 'vitest';
import {
  didYouMean,
  editDistance,
  knownFields,
  nearestField,
  schemaErrors,
} from '../../../src/api/schema-errors.ts';
import { formatFieldErrors, validateProxy, validateProxyPool } from '../../../src/api/validate.ts';
import { managed } from '../../support/api/manifests.ts';
import { basePool } from '../../support/api/pool-manifests.ts';

const LEASE_FIELDS = ['target', 'selector', 'namespace', 'ttlSeconds', 'wait'];

describe('editDistance', () => {
  it.each([
    ['', '', 0],
    ['abc', '', 3],
    ['kitten', 'sitting', 3],
    ['namsepace', 'namespace', 1],
    ['ttl', 'ttlSeconds', 7],
  ] as const)('%s → %s is %i', (a, b, d) => {
    expect(editDistance(a, b)).toBe(d);
    expect(editDistance(b, a)).toBe(d);
  });
});

describe('nearestField', () => {
  it.each([
    // The same name written differently.
    ['TTLSeconds', 'ttlSeconds'],
    ['ttl_seconds', 'ttlSeconds'],
    ['ttl-seconds', 'ttlSeconds'],
    // Typos: at most a third of the name, transpositions count once.
    ['selecter', 'selector'],
    ['namsepace', 'namespace'],
    ['targets', 'target'],
    ['ttlSecond', 'ttlSeconds'],
    // A prefix, when no typo is near: ttl is 5 edits from target but starts ttlSeconds.
    ['ttl', 'ttlSeconds'],
    ['TTL', 'ttlSeconds'],
    ['waitSeconds', 'wait'],
  ])('%s → %s', (name, near) => {
    expect(nearestField(name, LEASE_FIELDS)).toBe(near);
  });

  it.each([['why'], ['pool'], ['x'], ['tgt'], ['tt'], [''], ['-'], ['a'.repeat(65)]])(
    '%s → nothing near',
    (name) => {
      expect(nearestField(name, LEASE_FIELDS)).toBeUndefined();
    },
  );

  it('prefers the smallest distance within a tier, then the first known', () => {
    expect(nearestField('port', ['ports', 'part'])).toBe('ports');
    expect(nearestField('bort', ['port', 'sort'])).toBe('port');
    expect(nearestField('zone', [])).toBeUndefined();
  });

  it('didYouMean words the suggestion, written as the caller names fields', () => {
    expect(didYouMean('ttl', LEASE_FIELDS)).toBe('; did you mean "ttlSeconds"?');
    expect(didYouMean('nme', ['name'], (f) => `proxy.${f}`)).toBe('; did you mean "proxy.name"?');
    expect(didYouMean('why', LEASE_FIELDS)).toBe('');
  });
});

describe('knownFields', () => {
  const schema = Type.Object(
    {
      ttlSeconds: Type.Optional(Type.Integer()),
      proxy: Type.Optional(
        Type.Object({ name: Type.String(), namespace: Type.String() }, { additionalProperties: false }),
      ),
      list: Type.Optional(Type.Array(Type.Object({ 'a/b': Type.String() }, { additionalProperties: false }))),
    },
    { additionalProperties: false },
  );

  it('reads the properties of the object schema a TypeBox error points at', () => {
    const errors = Compile(schema).Errors({ ttl: 1, proxy: { nme: 'x', name: 'y', namespace: 'z' } });
    const paths = errors.filter((e) => e.keyword === 'additionalProperties').map((e) => e.schemaPath);
    expect(paths).toEqual(['#', '#/properties/proxy']);
    expect(knownFields(schema, '#')).toEqual(['ttlSeconds', 'proxy', 'list']);
    expect(knownFields(schema, '#/properties/proxy')).toEqual(['name', 'namespace']);
    expect(knownFields(schema, '#/properties/list/items')).toEqual(['a/b']);
    expect(knownFields(schema, '#/properties/nothing/here')).toEqual([]);
    expect(knownFields(schema, '#/properties/ttlSeconds')).toEqual([]);
  });

  it('schemaErrors names the nearest field only when given the schema', () => {
    const value = { ttl: 1, proxy: { nme: 'x', namespace: 'z' } };
    const errors = Compile(schema).Errors(value);
    const messages = (s?: unknown) =>
      schemaErrors(value, errors, [], s).filter((e) => e.message.startsWith('unknown field'));
    expect(messages(schema)).toEqual([
      { path: 'ttl', message: 'unknown field; did you mean "ttlSeconds"?' },
      { path: 'proxy.nme', message: 'unknown field; did you mean "name"?' },
    ]);
    expect(messages()).toEqual([
      { path: 'ttl', message: 'unknown field' },
      { path: 'proxy.nme', message: 'unknown field' },
    ]);
  });
});

describe('the validators name the nearest known field', () => {
  it('Proxy: a nested typo, a renamed field, and nothing for a field unlike any', () => {
    const result = validateProxy(
      managed({ healthCheck: { intervalSecond: 5, timeout: 2 }, Provider: 'x', bogus: 1 }),
    );
    expect(result.ok).toBe(false);
    const lines = result.ok ? [] : formatFieldErrors(result.errors).split('\n');
    expect(lines).toContain(
      'spec.healthCheck.intervalSecond: unknown field; did you mean "intervalSeconds"?',
    );
    expect(lines).toContain('spec.healthCheck.timeout: unknown field; did you mean "timeoutSeconds"?');
    expect(lines).toContain('spec.Provider: unknown field; did you mean "provider"?');
    expect(lines).toContain('spec.bogus: unknown field');
  });

  it('ProxyPool: in the spec and in the template', () => {
    const obj = basePool();
    obj.spec.replica = 3;
    (obj.spec.template as { spec: Record<string, unknown> }).spec.provder = 'local';
    const result = validateProxyPool(obj);
    const lines = result.ok ? [] : formatFieldErrors(result.errors).split('\n');
    expect(lines).toContain('spec.replica: unknown field; did you mean "replicas"?');
    expect(lines).toContain('spec.template.spec.provder: unknown field; did you mean "provider"?');
  });
});
