/**
 * Reflector edge cases with a scripted list/watch (no HTTP): in-stream ERROR events, servers
 * that end watches at once (no busy loop), a sink that throws, resume from the last
 * resourceVersion (bookmarks included) instead of relisting; backoff jitter from an injected
 * random source.
 */
import { describe, expect, it } from 'vitest';
import type { KubeObject } from '../../../src/api/meta.ts';
import { Informer } from '../../../src/runtime/kube/informer.ts';
import { Reflector, type WatchClient } from '../../../src/runtime/kube/reflector.ts';
import { captureLog } from '../../support/log.ts';
import { until } from '../../support/wait.ts';

const obj = (name: string, rv: string): KubeObject => ({
  metadata: { name, namespace: 'ns', resourceVersion: rv },
});

type Script = (
  query: Record<string, unknown>,
  emit: (type: string, o: unknown) => void,
  end: (err?: unknown) => void,
) => void;

/** A WatchClient that plays one script per watch call (the last one repeats). */
function scripted(
  scripts: Script[],
): WatchClient & { calls: Array<Record<string, unknown>>; callTimes: number[] } {
  const calls: Array<Record<string, unknown>> = [];
  const callTimes: number[] = [];
  return {
    calls,
    callTimes,
    async watch(_path, query, cb, done) {
      calls.push(query);
      callTimes.push(performance.now());
      const ac = new AbortController();
      let ended = false;
      const end = (err?: unknown) => {
        if (ended) return;
        ended = true;
        done(err ?? null);
      };
      ac.signal.addEventListener('abort', () => end());
      const script = scripts[Math.min(calls.length - 1, scripts.length - 1)]!;
      setTimeout(() => script(query, (t, o) => !ended && cb(t, o), end), 1);
      return ac;
    },
  };
}

function run(r: Reflector<KubeObject>) {
  const ac = new AbortController();
  const done = r.run(ac.signal);
  return async () => {
    ac.abort();
    await done;
  };
}

const idle: Script = () => {};

describe('Reflector', () => {
  it('resumes from the last event or bookmark resourceVersion after a clean close, without relisting', async () => {
    const inf = new Informer<KubeObject>('t');
    let lists = 0;
    const w = scripted([
      (_q, emit, end) => {
        emit('ADDED', obj('a', '11'));
        emit('BOOKMARK', { metadata: { resourceVersion: '15' } });
        end();
      },
      idle,
    ]);
    const r = new Reflector<KubeObject>({
      name: 't',
      list: async () => {
        lists++;
        return { items: [], metadata: { resourceVersion: '10' } };
      },
      watchClient: w,
      watchPath: '/x',
      sink: inf,
      initialBackoffMs: 5,
    });
    const stop = run(r);
    await until('the resumed (idle) watch', () => w.calls.length >= 2 && inf.get('ns/a'));
    await stop();
    expect(w.calls.map((q) => q.resourceVersion)).toEqual(['10', '15']);
    expect(w.calls[0]?.allowWatchBookmarks).toBe(true);
    expect(lists).toBe(1);
    expect(inf.get('ns/a')).toBeDefined();
  });

  it('relists on an in-stream 410, backs off on other ERROR events', async () => {
    const inf = new Informer<KubeObject>('t');
    let lists = 0;
    const w = scripted([
      (_q, emit) => emit('ERROR', { kind: 'Status', code: 410, reason: 'Expired' }),
      (_q, emit) => emit('ERROR', { kind: 'Status', code: 500, reason: 'InternalError' }),
      idle,
    ]);
    const r = new Reflector<KubeObject>({
      name: 't',
      list: async () => {
        lists++;
        return { items: [obj('a', String(lists))], metadata: { resourceVersion: String(20 + lists) } };
      },
      watchClient: w,
      watchPath: '/x',
      sink: inf,
      initialBackoffMs: 5,
    });
    const stop = run(r);
    await until('the 500 and the watch after it', () => r.stats.errors >= 1 && w.calls.length >= 3);
    await stop();
    expect(lists).toBe(2);
    expect(r.stats.relistsOnGone).toBe(1);
    expect(r.stats.errors).toBeGreaterThanOrEqual(1);
    expect(w.calls.map((q) => q.resourceVersion).slice(0, 3)).toEqual(['21', '22', '22']);
    expect(inf.get('ns/a')?.metadata.resourceVersion).toBe('2');
  });

  it('does not spin when the server ends every watch at once', async () => {
    const w = scripted([(_q, _emit, end) => end()]);
    const r = new Reflector<KubeObject>({
      name: 't',
      list: async () => ({ items: [], metadata: { resourceVersion: '1' } }),
      watchClient: w,
      watchPath: '/x',
      sink: new Informer<KubeObject>('t'),
      initialBackoffMs: 20,
      maxBackoffMs: 100,
    });
    const stop = run(r);
    await until('four watch attempts', () => w.calls.length >= 4);
    await stop();
    // Backoff doubles from 20 ms (±20 % jitter); a busy loop would re-watch within a millisecond.
    const gaps = w.callTimes.slice(1, 4).map((t, i) => t - w.callTimes[i]!);
    for (const gap of gaps) expect(gap).toBeGreaterThanOrEqual(15);
  });

  it('a sink that throws loses that event only; the stream and later events go on', async () => {
    const inf = new Informer<KubeObject>('t');
    const sink = {
      replace: (items: KubeObject[]) => inf.replace(items),
      remove: (o: KubeObject) => inf.remove(o),
      upsert: (o: KubeObject) => {
        if (o.metadata.name === 'bad') throw new Error('boom');
        inf.upsert(o);
      },
    };
    const w = scripted([
      (_q, emit) => {
        emit('ADDED', obj('bad', '2'));
        emit('ADDED', obj('good', '3'));
      },
    ]);
    const r = new Reflector<KubeObject>({
      name: 't',
      list: async () => ({ items: [], metadata: { resourceVersion: '1' } }),
      watchClient: w,
      watchPath: '/x',
      sink,
    });
    const stop = run(r);
    await until('the event after the throwing one', () => inf.get('ns/good'));
    await stop();
    expect(w.calls).toHaveLength(1);
  });

  it('follows continue tokens and restarts the list when a token expires', async () => {
    const inf = new Informer<KubeObject>('t');
    const pages: string[] = [];
    let expireOnce = true;
    const r = new Reflector<KubeObject>({
      name: 't',
      pageSize: 1,
      list: async ({ continue: c }) => {
        pages.push(c ?? 'first');
        if (c === 'p2' && expireOnce) {
          expireOnce = false;
          throw Object.assign(new Error('Expired'), { statusCode: 410 });
        }
        if (!c) return { items: [obj('a', '1')], metadata: { resourceVersion: '5', continue: 'p2' } };
        return { items: [obj('b', '2')], metadata: { resourceVersion: '5' } };
      },
      watchClient: scripted([idle]),
      watchPath: '/x',
      sink: inf,
      initialBackoffMs: 5,
    });
    const stop = run(r);
    await until('the restarted list to sync', () => r.hasSynced() && pages.length >= 4);
    await stop();
    expect(pages).toEqual(['first', 'p2', 'first', 'p2']);
    expect(inf.list().map((o) => o.metadata.name)).toEqual(['a', 'b']);
    expect(r.hasSynced()).toBe(true);
  });

  it('jitters its backoff with the injected random source (±20 % of the exponential delay)', async () => {
    const draws = [0, 0.5, 0.99];
    let used = 0;
    const captured = captureLog('warn');
    const r = new Reflector<KubeObject>({
      name: 't',
      list: async () => {
        throw Object.assign(new Error('apiserver down'), { statusCode: 503 });
      },
      watchClient: scripted([idle]),
      watchPath: '/x',
      sink: new Informer<KubeObject>('t'),
      initialBackoffMs: 10,
      maxBackoffMs: 1000,
      log: captured.log,
      random: () => draws[used++ % draws.length]!,
    });
    const stop = run(r);
    const retries = () => captured.lines.map((l) => l.retryInMs).filter((v) => v !== undefined);
    await until('three list retries', () => retries().length >= 3);
    await stop();
    // 10, 20, 40 ms before jitter; × 0.8, × 1.0, × 1.196.
    expect(retries().slice(0, 3)).toEqual([8, 20, 48]);
    expect(used).toBeGreaterThanOrEqual(3);
  });
});
