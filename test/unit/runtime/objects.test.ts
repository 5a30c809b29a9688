/**
 * The object engine: the Kubernetes semantics every backend inherits (resourceVersion,
 * preconditions, status subresource, generation, finalizers, watch resume and 410).
 */
import { describe, expect, it } from 'vitest';
import { ObjectEngine } from '../../../src/runtime/objects/engine.ts';
import type { EngineEvent } from '../../../src/runtime/objects/types.ts';
import {
  LEASE_RESOURCE,
  PROXY_RESOURCE,
  SECRET_RESOURCE,
  type StoredObject,
} from '../../../src/runtime/objects/types.ts';
import { applyJsonPatch, mergePatch, PatchError, parseJsonPatch } from '../../../src/runtime/patch.ts';
import { labelsMatch, parseSelector, SelectorError } from '../../../src/runtime/selector.ts';
import { StoreError } from '../../../src/runtime/store.ts';
import { FakeClock } from '../../support/clock.ts';

function setup() {
  const engine = new ObjectEngine({ clock: new FakeClock() });
  const px = engine.register(PROXY_RESOURCE);
  return { engine, px };
}

const proxy = (name: string, extra: Partial<StoredObject> = {}): StoredObject => ({
  metadata: { name, namespace: 'ns1', labels: { team: 'a' } },
  spec: { type: 'External', endpoint: { host: 'h', port: 1 } },
  ...extra,
});

function errOf(fn: () => unknown): StoreError {
  try {
    fn();
  } catch (e) {
    if (e instanceof StoreError) return e;
    throw e;
  }
  throw new Error('expected a StoreError');
}

describe('object engine', () => {
  it('create assigns uid, timestamps, generation 1, a fresh global RV and drops status', () => {
    const { engine, px } = setup();
    const sec = engine.register(SECRET_RESOURCE);
    const a = px.create(proxy('a', { status: { phase: 'Ready' } }));
    const s = sec.create({ metadata: { name: 's', namespace: 'ns1' }, stringData: { k: 'v' } });
    expect(a.metadata.uid).toMatch(/[0-9a-f-]{36}/);
    expect(a.metadata.generation).toBe(1);
    expect(a.metadata.creationTimestamp).toBe('2026-01-01T00:00:00Z');
    expect(a.status).toBeUndefined();
    expect(a.apiVersion).toBe('crawl.example.com/v1alpha1');
    expect(Number(s.metadata.resourceVersion)).toBeGreaterThan(Number(a.metadata.resourceVersion));
    expect(s.metadata.generation).toBeUndefined();
    expect(s.data).toEqual({ k: Buffer.from('v').toString('base64') });
    const dup = errOf(() => px.create(proxy('a')));
    expect([dup.reason, dup.code]).toEqual(['AlreadyExists', 409]);
    const genMeta = { generateName: 'gen-', namespace: 'ns1', name: '' };
    const gen = px.create({ metadata: genMeta, spec: {} });
    expect(gen.metadata.name).toMatch(/^gen-[a-z0-9]{5}$/);
  });

  it('list filters by namespace, label selector and field selector', () => {
    const { px } = setup();
    px.create(proxy('a'));
    px.create({ ...proxy('b'), metadata: { name: 'b', namespace: 'ns2', labels: { team: 'b', tier: 'x' } } });
    px.create({ ...proxy('c'), metadata: { name: 'c', namespace: 'ns1' } });
    const names = (q: Parameters<typeof px.list>[0]) => px.list(q).items.map((o) => o.metadata.name);
    expect(names({ namespace: 'ns1' })).toEqual(['a', 'c']);
    expect(names({ labelSelector: 'team in (a,b)' })).toEqual(['a', 'b']);
    expect(names({ labelSelector: 'team!=a' })).toEqual(['c', 'b']);
    expect(names({ labelSelector: '!team' })).toEqual(['c']);
    expect(names({ labelSelector: 'tier,team==b' })).toEqual(['b']);
    expect(names({ labelSelector: 'team notin (b)' })).toEqual(['a', 'c']);
    expect(names({ fieldSelector: 'metadata.name=c' })).toEqual(['c']);
    expect(names({ fieldSelector: 'metadata.namespace!=ns1' })).toEqual(['b']);
    expect(errOf(() => px.list({ labelSelector: 'a in (' })).code).toBe(400);
  });

  it('update: RV precondition, .status ignored, generation only on spec, no-op is silent', () => {
    const { engine, px } = setup();
    const events: EngineEvent[] = [];
    engine.onCommit((e) => events.push(e));
    const a = px.create(proxy('a'));
    expect(
      errOf(() => px.update({ ...a, metadata: { ...a.metadata, resourceVersion: undefined } })).reason,
    ).toBe('Invalid');
    const labelled = px.update({
      ...a,
      metadata: { ...a.metadata, labels: { team: 'z' } },
      status: { phase: 'X' },
    });
    expect(labelled.metadata.generation).toBe(1);
    expect(labelled.status).toBeUndefined();
    expect(errOf(() => px.update(a)).reason).toBe('Conflict');
    const specd = px.update({ ...labelled, spec: { type: 'External', endpoint: { host: 'h2', port: 1 } } });
    expect(specd.metadata.generation).toBe(2);
    const n = events.length;
    const same = px.update(specd);
    expect(same.metadata.resourceVersion).toBe(specd.metadata.resourceVersion);
    expect(events.length).toBe(n);
    const st = px.update(
      { ...specd, spec: { other: true }, status: { phase: 'Ready' } },
      { subresource: 'status' },
    );
    expect(st.status).toEqual({ phase: 'Ready' });
    expect(st.spec).toEqual(specd.spec);
    expect(st.metadata.generation).toBe(2);
  });

  it('patch: merge and JSON patch, RV in body is a precondition, failed test is 422', () => {
    const { px } = setup();
    const a = px.create(proxy('a'));
    const p1 = px.patch(
      'merge',
      { status: { phase: 'Ready', conditions: [] } },
      { namespace: 'ns1', name: 'a', subresource: 'status' },
    );
    expect(p1.status).toEqual({ phase: 'Ready', conditions: [] });
    const stale = errOf(() =>
      px.patch(
        'merge',
        { metadata: { resourceVersion: a.metadata.resourceVersion }, status: { phase: 'X' } },
        {
          namespace: 'ns1',
          name: 'a',
          subresource: 'status',
        },
      ),
    );
    expect([stale.reason, stale.code]).toEqual(['Conflict', 409]);
    const p2 = px.patch(
      'json',
      [
        { op: 'test', path: '/metadata/resourceVersion', value: p1.metadata.resourceVersion },
        { op: 'add', path: '/metadata/finalizers', value: ['f'] },
      ],
      { namespace: 'ns1', name: 'a' },
    );
    expect(p2.metadata.finalizers).toEqual(['f']);
    const failed = errOf(() =>
      px.patch('json', [{ op: 'test', path: '/metadata/resourceVersion', value: '1' }], {
        namespace: 'ns1',
        name: 'a',
      }),
    );
    expect([failed.reason, failed.code]).toEqual(['Invalid', 422]);
    expect(errOf(() => px.patch('json', { not: 'an array' }, { namespace: 'ns1', name: 'a' })).code).toBe(
      400,
    );
    expect(errOf(() => px.patch('merge', {}, { namespace: 'ns1', name: 'nope' })).reason).toBe('NotFound');
  });

  it('delete with finalizers marks, is idempotent, forbids new finalizers, and completes on last removal', () => {
    const { engine, px } = setup();
    const events: EngineEvent[] = [];
    engine.onCommit((e) => events.push(e));
    const a = px.create(proxy('a', { metadata: { name: 'a', namespace: 'ns1', finalizers: ['f1', 'f2'] } }));
    expect(errOf(() => px.delete('ns1', 'a', { uid: 'other' })).reason).toBe('Conflict');
    const d1 = px.delete('ns1', 'a', { uid: a.metadata.uid });
    expect(d1.deleted).toBe(false);
    expect(d1.object.metadata.deletionTimestamp).toBe('2026-01-01T00:00:00Z');
    expect((d1.object.metadata as Record<string, unknown>).deletionGracePeriodSeconds).toBe(0);
    expect(d1.object.metadata.generation).toBe(2);
    expect(events.at(-1)?.type).toBe('MODIFIED');
    const d2 = px.delete('ns1', 'a');
    expect(d2.object.metadata.resourceVersion).toBe(d1.object.metadata.resourceVersion);
    const cur = px.read('ns1', 'a');
    expect(
      errOf(() => px.update({ ...cur, metadata: { ...cur.metadata, finalizers: ['f1', 'f2', 'f3'] } }))
        .reason,
    ).toBe('Invalid');
    const one = px.update({ ...cur, metadata: { ...cur.metadata, finalizers: ['f2'] } });
    expect(one.metadata.finalizers).toEqual(['f2']);
    px.update({ ...one, metadata: { ...one.metadata, finalizers: [] } });
    expect(px.get('ns1', 'a')).toBeUndefined();
    expect(events.at(-1)?.type).toBe('DELETED');
    expect(errOf(() => px.delete('ns1', 'a')).reason).toBe('NotFound');
    const b = px.create(proxy('b'));
    const gone = px.delete('ns1', 'b');
    expect(gone.deleted).toBe(true);
    expect(Number(gone.object.metadata.resourceVersion)).toBeGreaterThan(Number(b.metadata.resourceVersion));
  });

  it('watch resumes from a resourceVersion, maps selector transitions, and is Gone after compaction', () => {
    const { engine, px } = setup();
    const a = px.create(proxy('a'));
    px.update({ ...a, metadata: { ...a.metadata, labels: { team: 'b' } } });
    const seen: string[] = [];
    const w = px.watch({ resourceVersion: a.metadata.resourceVersion, labelSelector: 'team=a' }, (e) =>
      seen.push(`${e.type}:${e.object.metadata.name}`),
    );
    expect(seen).toEqual(['DELETED:a']);
    px.create(proxy('c'));
    w.stop();
    px.create(proxy('d'));
    expect(seen).toEqual(['DELETED:a', 'ADDED:c']);
    const initial: string[] = [];
    px.watch({ resourceVersion: '0' }, (e) => initial.push(`${e.type}:${e.object.metadata.name}`)).stop();
    expect(initial).toEqual(['ADDED:a', 'ADDED:c', 'ADDED:d']);
    px.create(proxy('e'));
    engine.compact();
    const gone = errOf(() => px.watch({ resourceVersion: a.metadata.resourceVersion }, () => {}));
    expect([gone.reason, gone.code]).toEqual(['Gone', 410]);
    expect(() =>
      px.watch({ resourceVersion: String(engine.resourceVersion) }, () => {}).stop(),
    ).not.toThrow();
  });

  it('bounded history compacts the oldest events', () => {
    const engine = new ObjectEngine({ historyLimit: 3 });
    const px = engine.register(PROXY_RESOURCE);
    for (const n of ['a', 'b', 'c', 'd', 'e']) px.create(proxy(n));
    expect(errOf(() => px.watch({ resourceVersion: '1' }, () => {})).code).toBe(410);
    const seen: string[] = [];
    px.watch({ resourceVersion: '2' }, (e) => seen.push(e.object.metadata.name)).stop();
    expect(seen).toEqual(['c', 'd', 'e']);
  });

  it('lease MicroTime fields need six fractional digits', () => {
    const engine = new ObjectEngine();
    const leases = engine.register(LEASE_RESOURCE);
    const bad = errOf(() =>
      leases.create({
        metadata: { name: 'l', namespace: 'ns' },
        spec: { renewTime: '2026-01-01T00:00:00.123Z' },
      }),
    );
    expect([bad.reason, bad.code]).toEqual(['BadRequest', 400]);
    const ok = leases.create({
      metadata: { name: 'l', namespace: 'ns' },
      spec: { renewTime: '2026-01-01T00:00:00.123456Z', holderIdentity: 'x' },
    });
    expect(ok.metadata.generation).toBeUndefined();
  });

  it('snapshot and restore keep objects, UIDs and the RV sequence', () => {
    const { engine, px } = setup();
    const a = px.create(proxy('a'));
    const snap = JSON.parse(JSON.stringify(engine.snapshot()));
    const other = new ObjectEngine();
    const px2 = other.register(PROXY_RESOURCE);
    other.restore(snap);
    expect(px2.read('ns1', 'a').metadata.uid).toBe(a.metadata.uid);
    const b = px2.create(proxy('b'));
    expect(Number(b.metadata.resourceVersion)).toBe(engine.resourceVersion + 1);
    expect(errOf(() => px2.watch({ resourceVersion: '0x' }, () => {})).code).toBe(400);
  });

  it('label selector syntax: accepted forms match like Kubernetes, malformed ones are rejected', () => {
    const l = { app: 'squid', 'crawl.example.com/pool': 'eu' };
    expect(labelsMatch('app=squid,crawl.example.com/pool in (eu, us)', l)).toBe(true);
    expect(labelsMatch('app==squid', l)).toBe(true);
    expect(labelsMatch('app!=squid', l)).toBe(false);
    expect(labelsMatch('missing!=x', l)).toBe(true);
    expect(labelsMatch('missing notin (x)', l)).toBe(true);
    expect(labelsMatch('missing in (x)', l)).toBe(false);
    expect(labelsMatch('!app', l)).toBe(false);
    expect(labelsMatch('', l)).toBe(true);
    for (const bad of ['a in ()', '=b', 'a b', 'a in (x,,y)', 'a=(b', 'a=b,']) {
      expect(() => parseSelector(bad), bad).toThrow(SelectorError);
    }
  });

  it('patches follow RFC 7386 and RFC 6902 and never mutate their input', () => {
    const doc = { a: { b: 1, c: [1, 2] }, d: 'x', 'e/f': { '~g': 1 } };
    const frozen = JSON.stringify(doc);
    expect(mergePatch(doc, { a: { b: null, c: [3] }, d: null, n: { m: 1 } })).toEqual({
      a: { c: [3] },
      'e/f': { '~g': 1 },
      n: { m: 1 },
    });
    const ops = parseJsonPatch([
      { op: 'add', path: '/a/c/1', value: 9 },
      { op: 'add', path: '/a/c/-', value: 7 },
      { op: 'remove', path: '/a/c/0' },
      { op: 'move', from: '/d', path: '/moved' },
      { op: 'copy', from: '/moved', path: '/copied' },
      { op: 'replace', path: '/e~1f/~0g', value: 2 },
      { op: 'test', path: '/a/c', value: [9, 2, 7] },
    ]);
    expect(applyJsonPatch(doc, ops)).toEqual({
      a: { b: 1, c: [9, 2, 7] },
      moved: 'x',
      copied: 'x',
      'e/f': { '~g': 2 },
    });
    expect(JSON.stringify(doc)).toBe(frozen);
    const fails = (o: unknown) => {
      try {
        applyJsonPatch(doc, parseJsonPatch(o));
      } catch (e) {
        return e instanceof PatchError ? e.kind : 'other';
      }
      return 'ok';
    };
    expect(fails([{ op: 'replace', path: '/nope', value: 1 }])).toBe('failed');
    expect(fails([{ op: 'remove', path: '/a/c/5' }])).toBe('failed');
    expect(fails([{ op: 'test', path: '/d', value: 'y' }])).toBe('failed');
    expect(fails([{ op: 'frobnicate', path: '/d' }])).toBe('bad');
    expect(fails([{ op: 'add', path: '/d' }])).toBe('bad');
    expect(fails({ op: 'add' })).toBe('bad');
  });
});
