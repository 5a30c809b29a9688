/**
 * The standalone store against a careless operator: symlinked manifests, a second file that
 * defines an existing name, manifests that suddenly vanish, damaged state files and locks left
 * by a previous incarnation. Each case must change nothing (or take over safely) and say why.
 */
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { mkdir, mkdtemp, readFile, rename, rm, symlink, truncate, unlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import {
  createEmbeddedStore,
  type EmbeddedStore,
  StateFileError,
  StateLockedError,
} from '../../../src/runtime/embedded/index.ts';
import { captureLog } from '../../support/log.ts';
import { until } from '../../support/wait.ts';

const dirs: string[] = [];
async function tempDir(): Promise<string> {
  const d = await mkdtemp(join(tmpdir(), 'embedded-safety-'));
  dirs.push(d);
  return d;
}

const proxyYaml = (name: string, extra = '') => `apiVersion: crawl.example.com/v1alpha1
kind: Proxy
metadata:
  name: ${name}
spec:
  type: External
  endpoint: {host: 203.0.113.7, port: 8080}
${extra ? `${extra}\n` : ''}`;

const open: EmbeddedStore[] = [];
const make = async (opts: Parameters<typeof createEmbeddedStore>[0]) => {
  const s = await createEmbeddedStore({ rescanIntervalMs: 0, debounceMs: 20, ...opts });
  open.push(s);
  return s;
};
const stopStore = async (s: EmbeddedStore) => {
  await s.stop();
  open.splice(open.indexOf(s), 1);
};
afterEach(async () => {
  for (const s of open.splice(0)) await s.stop();
  for (const d of dirs.splice(0)) await rm(d, { recursive: true, force: true });
});

const key = (name: string) => ({ namespace: 'default', name });

async function manifestsDir(files: Record<string, string>): Promise<{ dir: string; m: string }> {
  const dir = await tempDir();
  const m = join(dir, 'proxies');
  await mkdir(m);
  for (const [f, text] of Object.entries(files)) await writeFile(join(m, f), text);
  return { dir, m };
}

describe('symlinked manifests', () => {
  it('reads a symlinked manifest file and a symlinked manifests directory', async () => {
    const dir = await tempDir();
    const real = join(dir, 'real');
    await mkdir(real);
    await writeFile(join(real, 'a.yaml'), proxyYaml('a'));
    const m = join(dir, 'proxies');
    await mkdir(m);
    await symlink(join(real, 'a.yaml'), join(m, 'a.yaml'));
    const store = await make({ manifests: m, statePath: join(dir, 'state.json') });
    expect(store.proxies.get(key('a'))).toBeDefined();

    const linkedDir = join(dir, 'linked');
    await symlink(real, linkedDir);
    const other = await make({ manifests: linkedDir, statePath: join(dir, 'other.json') });
    expect(other.proxies.get(key('a'))).toBeDefined();
  });

  it('treats a file replaced by a symlink to the same content as an edit: nothing is deleted', async () => {
    const { dir, m } = await manifestsDir({ 'a.yaml': proxyYaml('a'), 'b.yaml': proxyYaml('b') });
    const store = await make({ manifests: m, statePath: join(dir, 'state.json') });
    const before = await store.proxies.read(key('a'));
    const elsewhere = join(dir, 'kept', 'a.yaml');
    await mkdir(join(dir, 'kept'));
    await writeFile(elsewhere, proxyYaml('a'));
    await unlink(join(m, 'a.yaml'));
    await symlink(elsewhere, join(m, 'a.yaml'));
    expect(await store.rescan()).toEqual([]);
    const after = await store.proxies.read(key('a'));
    expect(after.metadata.uid).toBe(before.metadata.uid);
    expect(after.metadata.deletionTimestamp).toBeUndefined();
    expect(after.metadata.resourceVersion).toBe(before.metadata.resourceVersion);
  });

  it('sees an edit of a symlink target outside the manifests directory at once', async () => {
    const dir = await tempDir();
    await mkdir(join(dir, 'real'));
    await writeFile(join(dir, 'real', 'a.yaml'), proxyYaml('a'));
    const m = join(dir, 'proxies');
    await mkdir(m);
    await symlink(join(dir, 'real', 'a.yaml'), join(m, 'a.yaml'));
    const store = await make({ manifests: m, statePath: join(dir, 'state.json') });
    await store.start(new AbortController().signal);
    // Periodic rescans are off (rescanIntervalMs 0): only a watch can see this.
    await until(
      'the target directory to be watched',
      async () => {
        await writeFile(join(dir, 'real', 'a.yaml'), proxyYaml('a', '  drain: true'));
        return store.proxies.get(key('a'))?.spec.drain;
      },
      { timeoutMs: 5000, intervalMs: 200 },
    );
  });

  it('reports a symlink loop or a dangling symlink as an error of that file and keeps its objects', async () => {
    const { dir, m } = await manifestsDir({ 'a.yaml': proxyYaml('a'), 'b.yaml': proxyYaml('b') });
    const store = await make({ manifests: m, statePath: join(dir, 'state.json') });
    await unlink(join(m, 'a.yaml'));
    await symlink(join(m, 'loop.yaml'), join(m, 'a.yaml'));
    await symlink(join(m, 'a.yaml'), join(m, 'loop.yaml'));
    const errs = await store.rescan();
    expect(errs.map((e) => e.file).sort()).toEqual([join(m, 'a.yaml'), join(m, 'loop.yaml')]);
    expect(errs[0]?.message).toMatch(/symlink/);
    expect(store.proxies.get(key('a'))?.metadata.deletionTimestamp).toBeUndefined();

    await unlink(join(m, 'loop.yaml'));
    const dangling = await store.rescan();
    expect(dangling).toEqual([expect.objectContaining({ file: join(m, 'a.yaml') })]);
    expect(dangling[0]?.message).toMatch(/dangling symlink/);
    expect(store.proxies.get(key('a'))?.metadata.deletionTimestamp).toBeUndefined();
  });
});

describe('a name defined in two files', () => {
  it('rejects the file that adds the duplicate, whatever its name sorts as', async () => {
    const { dir, m } = await manifestsDir({ 'b.yaml': proxyYaml('x', '  maxLeases: 1') });
    const store = await make({ manifests: m, statePath: join(dir, 'state.json') });
    await writeFile(join(m, 'a-dup.yaml'), `${proxyYaml('x', '  maxLeases: 5')}---\n${proxyYaml('y')}`);
    const errs = await store.rescan();
    expect(errs).toHaveLength(1);
    expect(errs[0]?.file).toBe(join(m, 'a-dup.yaml'));
    expect(errs[0]?.message).toContain('default/x');
    expect(errs[0]?.message).toContain(join(m, 'b.yaml'));
    expect(store.proxies.get(key('x'))?.spec.maxLeases).toBe(1);
    expect(store.proxies.get(key('y'))).toBeUndefined(); // the rejected file changes nothing

    // The owner keeps it across a restart as well.
    await stopStore(store);
    const again = await make({ manifests: m, statePath: join(dir, 'state.json') });
    expect(again.manifestErrors()[0]?.file).toBe(join(m, 'a-dup.yaml'));
    expect(again.proxies.get(key('x'))?.spec.maxLeases).toBe(1);
  });

  it('keeps the owner when the owner file itself is broken', async () => {
    const { dir, m } = await manifestsDir({ 'b.yaml': proxyYaml('x', '  maxLeases: 1') });
    const store = await make({ manifests: m, statePath: join(dir, 'state.json') });
    await writeFile(join(m, 'b.yaml'), 'kind: Proxy\n  bad: [indent');
    await writeFile(join(m, 'c.yaml'), proxyYaml('x', '  maxLeases: 7'));
    const errs = await store.rescan();
    expect(errs.map((e) => e.file).sort()).toEqual([join(m, 'b.yaml'), join(m, 'c.yaml')]);
    expect(store.proxies.get(key('x'))?.spec.maxLeases).toBe(1);
  });

  it('on a fresh start the file that sorts first owns the name, and the other is an error', async () => {
    const { dir, m } = await manifestsDir({
      'b.yaml': proxyYaml('x', '  maxLeases: 2'),
      'a.yaml': proxyYaml('x', '  maxLeases: 1'),
    });
    const store = await make({ manifests: m, statePath: join(dir, 'state.json') });
    expect(store.proxies.get(key('x'))?.spec.maxLeases).toBe(1);
    const errs = store.manifestErrors();
    expect(errs).toHaveLength(1);
    expect(errs[0]?.file).toBe(join(m, 'b.yaml'));
    expect(errs[0]?.message).toContain(join(m, 'a.yaml'));
  });
});

describe('manifests that suddenly vanish', () => {
  const names = (s: EmbeddedStore) =>
    s.proxies
      .list()
      .filter((p) => !p.metadata.deletionTimestamp)
      .map((p) => p.metadata.name)
      .sort();

  it('deletes nothing when every Proxy disappears at once, and warns on each rescan', async () => {
    const { dir, m } = await manifestsDir({ 'a.yaml': proxyYaml('a'), 'b.yaml': proxyYaml('b') });
    const { log, lines } = captureLog();
    const store = await make({ manifests: m, statePath: join(dir, 'state.json'), log });
    await truncate(join(m, 'a.yaml'), 0);
    await unlink(join(m, 'b.yaml'));
    await store.rescan();
    expect(names(store)).toEqual(['a', 'b']);
    const warnings = () =>
      lines.filter((l) => Number(l.level) >= 40 && /--allow-empty-manifests/.test(String(l.msg)));
    expect(warnings()).toHaveLength(1);
    expect(warnings()[0]).toMatchObject({ proxiesBefore: 2, proxiesAfter: 0 });
    await store.rescan(); // each rescan warns again (rate-limited on the clock)
    expect(warnings().length).toBeGreaterThanOrEqual(1);

    // Restoring the files ends it; nothing was deleted in between.
    await writeFile(join(m, 'a.yaml'), proxyYaml('a'));
    await writeFile(join(m, 'b.yaml'), proxyYaml('b'));
    expect(await store.rescan()).toEqual([]);
    expect(names(store)).toEqual(['a', 'b']);
  });

  it('deletes nothing when more than half of the Proxies go at once, also across a restart', async () => {
    const { dir, m } = await manifestsDir({
      'a.yaml': proxyYaml('a'),
      'b.yaml': proxyYaml('b'),
      'c.yaml': proxyYaml('c'),
    });
    const statePath = join(dir, 'state.json');
    const store = await make({ manifests: m, statePath });
    await unlink(join(m, 'b.yaml'));
    await unlink(join(m, 'c.yaml'));
    await store.rescan();
    expect(names(store)).toEqual(['a', 'b', 'c']);
    await stopStore(store);
    const again = await make({ manifests: m, statePath });
    expect(names(again)).toEqual(['a', 'b', 'c']);
    await stopStore(again);

    // Confirmed: the deletions go ahead.
    const confirmed = await make({ manifests: m, statePath, allowEmptyManifests: true });
    expect(names(confirmed)).toEqual(['a']);
  });

  it('still deletes a single removed Proxy out of several', async () => {
    const { dir, m } = await manifestsDir({
      'a.yaml': proxyYaml('a'),
      'b.yaml': proxyYaml('b'),
      'c.yaml': proxyYaml('c'),
    });
    const store = await make({ manifests: m, statePath: join(dir, 'state.json') });
    await unlink(join(m, 'c.yaml'));
    await store.rescan();
    expect(names(store)).toEqual(['a', 'b']);
  });

  describe('ProxyPools count for the Proxies they own', () => {
    const poolYaml = (name: string) => `apiVersion: crawl.example.com/v1alpha1
kind: ProxyPool
metadata:
  name: ${name}
spec:
  replicas: 6
  template:
    spec: {provider: local}
`;
    /** Six Proxies owned by pool `eu` (as the pool controller creates them) beside three of the manifests'. */
    async function fleet(files: Record<string, string>) {
      const { dir, m } = await manifestsDir(files);
      const { log, lines } = captureLog();
      const statePath = join(dir, 'state.json');
      const store = await make({ manifests: m, statePath, log });
      const pool = store.proxyPools.get(key('eu'));
      expect(pool?.metadata.uid).toBeTruthy();
      for (let i = 0; i < 6; i++) {
        await store.proxies.create({
          apiVersion: 'crawl.example.com/v1alpha1',
          kind: 'Proxy',
          metadata: {
            name: `eu-${i}`,
            namespace: 'default',
            labels: { 'crawl.example.com/pool': 'eu' },
            ownerReferences: [
              {
                apiVersion: 'crawl.example.com/v1alpha1',
                kind: 'ProxyPool',
                name: 'eu',
                uid: pool?.metadata.uid ?? '',
                controller: true,
                blockOwnerDeletion: true,
              },
            ],
          },
          spec: { provider: 'local' },
        } as never);
      }
      const held = () =>
        lines.filter((l) => Number(l.level) >= 40 && /--allow-empty-manifests/.test(String(l.msg)));
      return { m, store, statePath, held };
    }
    const pools = (s: EmbeddedStore) =>
      s.proxyPools
        .list()
        .filter((p) => !p.metadata.deletionTimestamp)
        .map((p) => p.metadata.name);

    for (const [what, change] of [
      ['removed', (f: string) => unlink(f)],
      ['emptied', (f: string) => writeFile(f, '')],
    ] as const) {
      it(`holds a ${what} pool file that would take 6 of 9 Proxies, naming the count`, async () => {
        const { m, store, held } = await fleet({
          'a.yaml': proxyYaml('a'),
          'b.yaml': proxyYaml('b'),
          'c.yaml': proxyYaml('c'),
          'pool.yaml': poolYaml('eu'),
        });
        expect(names(store)).toHaveLength(9);
        await change(join(m, 'pool.yaml'));
        await store.rescan();
        expect(pools(store)).toEqual(['eu']);
        expect(names(store)).toHaveLength(9);
        expect(held()).toHaveLength(1);
        expect(held()[0]).toMatchObject({ proxiesBefore: 9, proxiesAfter: 3 });
        expect(String(held()[0]?.msg)).toMatch(/6 of the 9 Proxies \(directly or through their ProxyPools\)/);
      });
    }

    it('keeps the pool of an unparsable pool file, as any broken file', async () => {
      const { m, store, held } = await fleet({ 'a.yaml': proxyYaml('a'), 'pool.yaml': poolYaml('eu') });
      await writeFile(join(m, 'pool.yaml'), 'kind: ProxyPool\nspec: [unclosed');
      expect((await store.rescan()).length).toBeGreaterThan(0);
      expect(pools(store)).toEqual(['eu']);
      expect(names(store)).toHaveLength(7);
      expect(held()).toHaveLength(0);
    });

    it('holds a directory of pool files only when it is emptied; --allow-empty-manifests deletes', async () => {
      const { m, store, statePath, held } = await fleet({ 'pool.yaml': poolYaml('eu') });
      await unlink(join(m, 'pool.yaml'));
      await store.rescan();
      expect(pools(store)).toEqual(['eu']);
      expect(held()[0]).toMatchObject({ proxiesBefore: 6, proxiesAfter: 0 });
      await stopStore(store);
      const confirmed = await make({ manifests: m, statePath, allowEmptyManifests: true });
      expect(pools(confirmed)).toEqual([]);
    });

    it('still deletes a pool that owns no more than half of the fleet', async () => {
      const { dir, m } = await manifestsDir({
        'a.yaml': proxyYaml('a'),
        'b.yaml': proxyYaml('b'),
        'pool.yaml': poolYaml('small'),
      });
      const store = await make({ manifests: m, statePath: join(dir, 'state.json') });
      expect(pools(store)).toEqual(['small']);
      await unlink(join(m, 'pool.yaml'));
      await store.rescan();
      expect(pools(store)).toEqual([]);
    });
  });

  it('watches a re-created manifests directory again at once', async () => {
    const { dir, m } = await manifestsDir({ 'a.yaml': proxyYaml('a') });
    const store = await make({ manifests: m, statePath: join(dir, 'state.json') });
    await store.start(new AbortController().signal);
    await rename(m, join(dir, 'old'));
    await until('the rescan of the missing directory', () => store.manifestErrors().length > 0);
    await mkdir(m);
    await writeFile(join(m, 'a.yaml'), proxyYaml('a', '  drain: true'));
    await until('the re-created directory to be read', () => store.proxies.get(key('a'))?.spec.drain, {
      timeoutMs: 5000,
    });
  });
});

describe('the state file', () => {
  it('refuses an empty or whitespace-only state file, naming it and how to start fresh', async () => {
    const dir = await tempDir();
    const statePath = join(dir, 'state.json');
    for (const text of ['', '  \n\n \t\n']) {
      await writeFile(statePath, text);
      const err = await createEmbeddedStore({ statePath }).catch((e) => e);
      expect(err).toBeInstanceOf(StateFileError);
      expect(err.message).toContain(statePath);
      expect(err.message).toMatch(/empty/);
      expect(err.message).toMatch(/delete the file/);
      expect(await readFile(statePath, 'utf8')).toBe(text);
    }
  });

  it('names file and line for a snapshot or record of the wrong shape', async () => {
    const dir = await tempDir();
    const statePath = join(dir, 'state.json');
    const s = await make({ statePath });
    await s.secrets.create({ metadata: { name: 's1', namespace: 'ns' }, data: { k: 'dg==' } });
    await stopStore(s);
    const good = await readFile(statePath, 'utf8');
    const header = JSON.parse(good.split('\n')[0] as string);
    const cases: Array<[string, RegExp]> = [
      [`${JSON.stringify({ ...header, objects: 7 })}\n`, /line 1: objects/],
      [`${JSON.stringify({ ...header, objects: { secrets: [{ kind: 'x' }] } })}\n`, /line 1: objects/],
      [`${JSON.stringify({ ...header, resourceVersion: 'x' })}\n`, /line 1: resourceVersion/],
      [`${good}{"rv":5}\n`, /line 2: /],
      [`${good}[1,2]\n`, /line 2: /],
      [`${good}{"rv":9,"r":"secrets","k":"ns/a","o":{"metadata":"x"}}\n`, /line 2: /],
    ];
    for (const [text, want] of cases) {
      await writeFile(statePath, text);
      const err = await createEmbeddedStore({ statePath }).catch((e) => e);
      expect(err, text).toBeInstanceOf(StateFileError);
      expect(err.message).toContain(statePath);
      expect(err.message).toMatch(want);
    }
  });

  it('reports a snapshot cut short as data loss, not as a torn tail', async () => {
    const dir = await tempDir();
    const statePath = join(dir, 'state.json');
    const s = await make({ statePath });
    await s.secrets.create({ metadata: { name: 's1', namespace: 'ns' }, data: { k: 'dg==' } });
    await stopStore(s);
    const text = await readFile(statePath, 'utf8');
    await writeFile(statePath, text.slice(0, Math.floor(text.length / 2)));
    const err = await createEmbeddedStore({ statePath }).catch((e) => e);
    expect(err).toBeInstanceOf(StateFileError);
    expect(err.message).toContain(statePath);
    expect(err.message).toMatch(/truncated/);
    expect(err.message).toMatch(/lost/);
  });

  it('leaves a single complete snapshot after a clean stop, so any later truncation is detected', async () => {
    const dir = await tempDir();
    const statePath = join(dir, 'state.json');
    const s = await make({ statePath });
    for (let i = 0; i < 3; i++)
      await s.secrets.create({ metadata: { name: `s${i}`, namespace: 'ns' }, data: { k: 'dg==' } });
    await stopStore(s);
    const lines = (await readFile(statePath, 'utf8')).split('\n');
    expect(lines).toHaveLength(2); // one snapshot line and the final newline
    expect(lines[1]).toBe('');
  });
});

describe('the lock file', () => {
  const lockedBy = async (statePath: string) => {
    const err = await createEmbeddedStore({ statePath }).catch((e) => e);
    return err instanceof StateLockedError ? err : undefined;
  };

  it('takes over a lock holding our own PID that this process does not hold (PID 1 after kill -9)', async () => {
    const dir = await tempDir();
    const statePath = join(dir, 'state.json');
    await writeFile(`${statePath}.lock`, `${process.pid}\n`);
    const s = await make({ statePath });
    expect(s.proxies.list()).toEqual([]);
    // And the lock now records this process in a form that survives PID reuse.
    const rec = JSON.parse(readFileSync(`${statePath}.lock`, 'utf8'));
    expect(rec).toMatchObject({ pid: process.pid });
    expect(typeof rec.startTime).toBe('string');
    expect(typeof rec.bootId).toBe('string');
    expect(await lockedBy(statePath)).toBeInstanceOf(StateLockedError);
  });

  it('takes over a lock from an earlier boot or a reused PID, never a live holder', async () => {
    const dir = await tempDir();
    const statePath = join(dir, 'state.json');
    const child = spawn(process.execPath, ['-e', 'setTimeout(() => {}, 60000)'], { stdio: 'ignore' });
    try {
      const pid = child.pid as number;
      const start = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]?.split(' ')[19];
      const bootId = readFileSync('/proc/sys/kernel/random/boot_id', 'utf8').trim();
      // The holder is alive and the record matches it: refused.
      await writeFile(`${statePath}.lock`, JSON.stringify({ pid, bootId, startTime: start }));
      const err = await lockedBy(statePath);
      expect(err?.pid).toBe(pid);
      // Same PID, another boot: stale.
      await writeFile(
        `${statePath}.lock`,
        JSON.stringify({ pid, bootId: 'an-earlier-boot', startTime: start }),
      );
      const s1 = await make({ statePath });
      await stopStore(s1);
      // Same PID and boot, but the process started at another time: the PID was reused.
      await writeFile(`${statePath}.lock`, JSON.stringify({ pid, bootId, startTime: '1' }));
      const s2 = await make({ statePath });
      expect(s2.proxies.list()).toEqual([]);
    } finally {
      child.kill('SIGKILL');
    }
  });

  it('lets exactly one of several concurrent starters take over a stale lock', async () => {
    const dir = await tempDir();
    const statePath = join(dir, 'state.json');
    await writeFile(
      `${statePath}.lock`,
      JSON.stringify({ pid: 2 ** 22 + 7, bootId: 'gone', startTime: '1' }),
    );
    const results = await Promise.allSettled(
      Array.from({ length: 4 }, () => createEmbeddedStore({ statePath, rescanIntervalMs: 0 })),
    );
    const won = results.filter((r) => r.status === 'fulfilled');
    for (const r of won) open.push((r as PromiseFulfilledResult<EmbeddedStore>).value);
    expect(won).toHaveLength(1);
    for (const r of results) {
      if (r.status === 'rejected') expect(r.reason).toBeInstanceOf(StateLockedError);
    }
  });
});
