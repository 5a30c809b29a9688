/**
 * The reflector-fed cache: diffs on relist, old objects on updates, stale versions ignored,
 * label-indexed lists, several label-selector sources feeding one Secret cache.
 */
import { describe, expect, it } from 'vitest';
import type { KubeObject } from '../../../src/api/meta.ts';
import { Informer, isNewerVersion, MultiSourceSink } from '../../../src/runtime/kube/informer.ts';
import type { WatchEvent } from '../../../src/runtime/store.ts';

const obj = (
  name: string,
  rv: string,
  labels: Record<string, string> = {},
  namespace = 'ns',
): KubeObject => ({
  metadata: { name, namespace, resourceVersion: rv, labels },
});

const flush = () => new Promise<void>((r) => setImmediate(r));

function recorder(inf: Informer<KubeObject>) {
  const events: string[] = [];
  const raw: WatchEvent<KubeObject>[] = [];
  inf.subscribe((e) => {
    raw.push(e);
    events.push(`${e.type}:${e.object.metadata.name}@${e.object.metadata.resourceVersion}`);
  });
  return { events, raw };
}

describe('isNewerVersion', () => {
  it('compares integer resourceVersions numerically, anything else by difference', () => {
    expect(isNewerVersion('10', '9')).toBe(true);
    expect(isNewerVersion('9', '10')).toBe(false);
    expect(isNewerVersion('5', '5')).toBe(false);
    expect(isNewerVersion('b', 'a')).toBe(true);
    expect(isNewerVersion('1', undefined)).toBe(true);
  });
});

describe('Informer', () => {
  it('replays the cache as ADDED to a new subscriber, then streams changes with old objects', async () => {
    const inf = new Informer<KubeObject>('t');
    inf.upsert(obj('a', '1'));
    const { events, raw } = recorder(inf);
    await flush();
    inf.upsert(obj('a', '2'));
    inf.upsert(obj('a', '2')); // duplicate delivery: ignored
    inf.upsert(obj('a', '1')); // stale: ignored
    inf.remove(obj('a', '3'));
    expect(events).toEqual(['ADDED:a@1', 'MODIFIED:a@2', 'DELETED:a@3']);
    expect(raw[1]?.old?.metadata.resourceVersion).toBe('1');
    expect(raw[2]?.old?.metadata.resourceVersion).toBe('2');
  });

  it('a relist emits exactly the differences', async () => {
    const inf = new Informer<KubeObject>('t');
    inf.replace([obj('a', '1'), obj('b', '1'), obj('c', '1')]);
    const { events } = recorder(inf);
    await flush();
    events.length = 0;
    inf.replace([obj('a', '1'), obj('b', '5'), obj('d', '6')]);
    expect(events.sort()).toEqual(['ADDED:d@6', 'DELETED:c@1', 'MODIFIED:b@5']);
  });

  it('lists by namespace and label selector through its indexes, sorted', () => {
    const inf = new Informer<KubeObject>('t');
    inf.upsert(obj('b', '1', { pool: 'eu' }));
    inf.upsert(obj('a', '1', { pool: 'eu', tier: 'x' }));
    inf.upsert(obj('c', '1', { pool: 'us' }, 'other'));
    inf.upsert(obj('a', '2', { pool: 'us' })); // relabelled: leaves the eu index
    const names = (o: Parameters<typeof inf.list>[0]) => inf.list(o).map((x) => x.metadata.name);
    expect(names({ labelSelector: 'pool=eu' })).toEqual(['b']);
    expect(names({ labelSelector: 'pool=us' })).toEqual(['a', 'c']);
    expect(names({ labelSelector: 'pool=us', namespace: 'ns' })).toEqual(['a']);
    expect(names({ namespace: 'other' })).toEqual(['c']);
    expect(names({ labelSelector: 'pool notin (eu)' })).toEqual(['a', 'c']);
    expect(() => inf.list({ labelSelector: 'bad key!' })).toThrow(/selector/);
  });

  it('synced waits for the first list and honours abort', async () => {
    const inf = new Informer<KubeObject>('t');
    const ac = new AbortController();
    const aborted = inf.synced(ac.signal);
    ac.abort(new Error('stop'));
    await expect(aborted).rejects.toThrow('stop');
    const p = inf.synced();
    inf.markSynced();
    await p;
    expect(inf.hasSynced()).toBe(true);
  });
});

describe('MultiSourceSink', () => {
  it('keeps an object while any source holds it and emits one event stream', async () => {
    const inf = new Informer<KubeObject>('secrets');
    const sink = new MultiSourceSink(inf);
    const a = sink.source('a', (o) => o.metadata.labels?.a === 'true');
    const b = sink.source('b', (o) => Object.hasOwn(o.metadata.labels ?? {}, 'b'));
    const { events } = recorder(inf);
    await flush();
    a.replace([obj('s', '1', { a: 'true', b: 'x' })]);
    b.replace([obj('s', '1', { a: 'true', b: 'x' })]);
    expect(events).toEqual(['ADDED:s@1']);
    a.upsert(obj('s', '2', { b: 'x' })); // leaves a's selection, still in b's
    b.upsert(obj('s', '2', { b: 'x' }));
    expect(events).toEqual(['ADDED:s@1', 'MODIFIED:s@2']);
    expect(inf.get('ns/s')).toBeDefined();
    b.remove(obj('s', '3', { b: 'x' }));
    expect(events.at(-1)).toBe('DELETED:s@3');
    expect(inf.get('ns/s')).toBeUndefined();
  });

  it('a relist of one source drops only what that source alone held', async () => {
    const inf = new Informer<KubeObject>('secrets');
    const sink = new MultiSourceSink(inf);
    const a = sink.source('a', () => true);
    const b = sink.source('b', () => true);
    a.replace([obj('both', '1'), obj('only-a', '1')]);
    b.replace([obj('both', '1')]);
    a.replace([]);
    expect(inf.list().map((o) => o.metadata.name)).toEqual(['both']);
  });
});
