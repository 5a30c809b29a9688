/**
 * The standalone store: passes the ObjectStore contract, applies manifests (validation that
 * changes nothing on error, generation, deletion through finalizers), survives restarts with
 * the same UIDs and status, and refuses a second process on the same state.
 */
import { spawn } from 'node:child_process';
import { mkdtemp, rm, unlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { FINALIZER } from '../../../src/api/constants.ts';
import {
  createEmbeddedStore,
  type EmbeddedStore,
  StateLockedError,
} from '../../../src/runtime/embedded/index.ts';
import { FakeClock } from '../../support/clock.ts';
import { runStoreContract } from '../../support/store-contract.ts';

const dirs: string[] = [];
async function tempDir(): Promise<string> {
  const d = await mkdtemp(join(tmpdir(), 'embedded-store-'));
  dirs.push(d);
  return d;
}

runStoreContract('embedded', async () => {
  const dir = await tempDir();
  const store = await createEmbeddedStore({ statePath: join(dir, 'state.json'), rescanIntervalMs: 0 });
  return { store, cleanup: () => store.stop() };
});

const proxyYaml = (name: string, extra = '') => `apiVersion: crawl.example.com/v1alpha1
kind: Proxy
metadata:
  name: ${name}
  labels: {pool: eu}
spec:
  type: External
  endpoint: {host: 203.0.113.7, port: 8080}
${extra ? `${extra}\n` : ''}`;

describe('embedded store', () => {
  const open: EmbeddedStore[] = [];
  const make = async (opts: Parameters<typeof createEmbeddedStore>[0]) => {
    const s = await createEmbeddedStore({ rescanIntervalMs: 0, debounceMs: 20, ...opts });
    open.push(s);
    return s;
  };
  afterEach(async () => {
    for (const s of open.splice(0)) await s.stop();
    for (const d of dirs.splice(0)) await rm(d, { recursive: true, force: true });
  });

  it('loads multi-document manifests, defaults the namespace, and keeps the previous version of a bad file', async () => {
    const dir = await tempDir();
    const m = join(dir, 'manifests');
    await (await import('node:fs/promises')).mkdir(m);
    await writeFile(
      join(m, 'a.yaml'),
      `${proxyYaml('a')}---\n${proxyYaml('b')}---\napiVersion: v1\nkind: Secret\nmetadata: {name: init, labels: {crawl.example.com/cloud-init: "true"}}\nstringData: {user-data: "#cloud-config"}\n`,
    );
    await writeFile(join(m, 'notes.txt'), 'ignored');
    const store = await make({ manifests: m, statePath: join(dir, 'state.json') });
    expect(store.manifestErrors()).toEqual([]);
    const a = store.proxies.get({ namespace: 'default', name: 'a' });
    expect(a?.metadata.labels).toEqual({ pool: 'eu' });
    expect(a?.spec.port).toBe(3128); // schema default applied, as the apiserver would
    expect(store.proxies.list().map((p) => p.metadata.name)).toEqual(['a', 'b']);
    expect(
      Buffer.from(
        store.secrets.get({ namespace: 'default', name: 'init' })?.data?.['user-data'] ?? '',
        'base64',
      ).toString(),
    ).toBe('#cloud-config');

    // A bad second document: the whole file keeps its previous version.
    await writeFile(
      join(m, 'a.yaml'),
      `${proxyYaml('a', '  drain: true')}---\n${proxyYaml('b').replace('port: 8080', 'port: 70000')}`,
    );
    const errs = await store.rescan();
    expect(errs).toHaveLength(1);
    expect(errs[0]).toMatchObject({ file: join(m, 'a.yaml'), document: 2, path: 'spec.endpoint.port' });
    expect(store.proxies.get({ namespace: 'default', name: 'a' })?.spec.drain).toBeUndefined();
    expect(store.proxies.get({ namespace: 'default', name: 'b' })).toBeDefined();
    expect(store.secrets.get({ namespace: 'default', name: 'init' })).toBeDefined();

    // Unparseable YAML and a changed immutable field are errors too, and change nothing.
    await writeFile(join(m, 'a.yaml'), 'kind: Proxy\n  bad: [indent');
    expect((await store.rescan())[0]).toMatchObject({ file: join(m, 'a.yaml'), document: 1 });
    await writeFile(
      join(m, 'a.yaml'),
      `${proxyYaml('a').replace('type: External', 'type: Managed')}---\n${proxyYaml('b')}`,
    );
    const immut = await store.rescan();
    expect(immut.length).toBeGreaterThan(0);
    expect(immut[0]).toMatchObject({ document: 1 });
    expect(store.proxies.get({ namespace: 'default', name: 'a' })?.spec.type).toBe('External');
  });

  it('rescans the manifests periodically on the injected clock', async () => {
    const dir = await tempDir();
    const m = join(dir, 'manifests');
    await (await import('node:fs/promises')).mkdir(m);
    await writeFile(join(m, 'p.yaml'), proxyYaml('a'));
    const clock = new FakeClock();
    // A debounce longer than the test: only the periodic rescan can pick the edit up.
    const store = await make({
      manifests: m,
      statePath: join(dir, 'state.json'),
      clock,
      rescanIntervalMs: 10_000,
      debounceMs: 3_600_000,
    });
    const ctrl = new AbortController();
    await store.start(ctrl.signal);
    await writeFile(join(m, 'p.yaml'), proxyYaml('a', '  drain: true'));
    clock.advance(9_999);
    expect(store.proxies.get({ namespace: 'default', name: 'a' })?.spec.drain).toBeUndefined();
    clock.advance(1);
    await vi.waitFor(() =>
      expect(store.proxies.get({ namespace: 'default', name: 'a' })?.spec.drain).toBe(true),
    );
    ctrl.abort();
  });

  it('rejects a manifest edit that moves a Managed proxy to another provider, and keeps the stored one', async () => {
    const dir = await tempDir();
    const m = join(dir, 'manifests');
    await (await import('node:fs/promises')).mkdir(m);
    const managedYaml = (provider: string, extra = '') =>
      `apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {name: eu-1}\nspec:\n  provider: ${provider}\n${extra}`;
    await writeFile(join(m, 'p.yaml'), managedYaml('local'));
    const store = await make({ manifests: m, statePath: join(dir, 'state.json') });
    expect(store.manifestErrors()).toEqual([]);
    const key = { namespace: 'default', name: 'eu-1' };

    await writeFile(join(m, 'p.yaml'), managedYaml('gcp-main', '  drain: true\n'));
    const errs = await store.rescan();
    expect(errs).toEqual([
      expect.objectContaining({
        file: join(m, 'p.yaml'),
        document: 1,
        path: 'spec.provider',
        message: expect.stringMatching(/immutable.*delete the Proxy and create it again/),
      }),
    ]);
    const cur = store.proxies.get(key);
    expect(cur?.spec.provider).toBe('local');
    expect(cur?.spec.drain).toBeUndefined(); // the whole document was refused, not just the field
    expect(cur?.metadata.generation).toBe(1);

    // Other edits of the same proxy still apply.
    await writeFile(join(m, 'p.yaml'), managedYaml('local', '  drain: true\n'));
    expect(await store.rescan()).toEqual([]);
    expect(store.proxies.get(key)?.spec.drain).toBe(true);
  });

  it('bumps generation on spec changes only, keeps operator fields, deletes through finalizers when a manifest goes', async () => {
    const dir = await tempDir();
    const m = join(dir, 'manifests');
    await (await import('node:fs/promises')).mkdir(m);
    await writeFile(join(m, 'a.yaml'), proxyYaml('a'));
    await writeFile(join(m, 'b.yaml'), proxyYaml('b'));
    // Both manifests go below: confirmed, as a user would with --allow-empty-manifests.
    const store = await make({ manifests: m, statePath: join(dir, 'state.json'), allowEmptyManifests: true });
    const key = { namespace: 'default', name: 'a' };
    const a = store.proxies.get(key);
    if (!a) throw new Error('missing');
    const withF = await store.proxies.addFinalizer(a, FINALIZER);
    await store.proxies.update({
      ...withF,
      metadata: { ...withF.metadata, annotations: { 'crawl.example.com/spec-hash': 'h1' } },
    });
    await store.proxies.patchStatus(key, { phase: 'Ready', providerID: 'local/a' });

    await writeFile(join(m, 'a.yaml'), proxyYaml('a').replace('{pool: eu}', '{pool: us}'));
    await store.rescan();
    let cur = await store.proxies.read(key);
    expect(cur.metadata.generation).toBe(1);
    expect(cur.metadata.labels).toEqual({ pool: 'us' });
    expect(cur.metadata.annotations).toEqual({ 'crawl.example.com/spec-hash': 'h1' });
    await writeFile(join(m, 'a.yaml'), proxyYaml('a', '  drain: true'));
    await store.rescan();
    cur = await store.proxies.read(key);
    expect(cur.metadata.generation).toBe(2);
    expect(cur.spec.drain).toBe(true);
    expect(cur.status?.providerID).toBe('local/a');
    expect(cur.metadata.finalizers).toEqual([FINALIZER]);

    await unlink(join(m, 'a.yaml'));
    await unlink(join(m, 'b.yaml'));
    await store.rescan();
    cur = await store.proxies.read(key);
    expect(cur.metadata.deletionTimestamp).toBeTruthy();
    expect(store.proxies.get({ namespace: 'default', name: 'b' })).toBeUndefined();
    await store.proxies.removeFinalizer(cur, FINALIZER);
    expect(store.proxies.get(key)).toBeUndefined();

    // Putting the manifest back creates a new object (new UID), picked up by the file watcher.
    await store.start(new AbortController().signal);
    await writeFile(join(m, 'a.yaml'), proxyYaml('a'));
    const again = await vi.waitFor(
      () => {
        const p = store.proxies.get(key);
        if (!p) throw new Error('not yet');
        return p;
      },
      { timeout: 5000, interval: 10 },
    );
    expect(again.metadata.uid).not.toBe(a.metadata.uid);
  });

  it('resumes after a restart with the same UIDs, status, finalizers and generated secrets', async () => {
    const dir = await tempDir();
    const m = join(dir, 'p.yaml');
    await writeFile(m, proxyYaml('a'));
    const statePath = join(dir, 'state.json');
    const s1 = await make({ manifests: m, statePath });
    const a = await s1.proxies.read({ namespace: 'default', name: 'a' });
    await s1.proxies.addFinalizer(a, FINALIZER);
    await s1.proxies.patchStatus(
      { namespace: 'default', name: 'a' },
      { phase: 'Ready', providerID: 'local/x' },
    );
    await s1.secrets.create({
      metadata: {
        name: 'a-auth',
        namespace: 'default',
        labels: { 'crawl.example.com/credentials-for': 'a' },
      },
      data: { password: Buffer.from('s3cret').toString('base64') },
    });
    await s1.providerHealths.create({
      apiVersion: 'crawl.example.com/v1alpha1',
      kind: 'ProviderHealth',
      metadata: { name: 'local' },
    });
    const rvBefore = s1.engine.resourceVersion;
    await s1.stop();
    open.splice(open.indexOf(s1), 1);

    const s2 = await make({ manifests: m, statePath });
    const b = await s2.proxies.read({ namespace: 'default', name: 'a' });
    expect(b.metadata.uid).toBe(a.metadata.uid);
    expect(b.status?.providerID).toBe('local/x');
    expect(b.metadata.finalizers).toEqual([FINALIZER]);
    expect(
      Buffer.from(
        s2.secrets.get({ namespace: 'default', name: 'a-auth' })?.data?.password ?? '',
        'base64',
      ).toString(),
    ).toBe('s3cret');
    expect(s2.providerHealths.get({ name: 'local' })).toBeDefined();
    expect(s2.engine.resourceVersion).toBe(rvBefore);
    const created = await s2.proxies.create({
      apiVersion: 'crawl.example.com/v1alpha1',
      kind: 'Proxy',
      metadata: { name: 'z', namespace: 'default' },
      spec: { type: 'External', endpoint: { host: 'h', port: 1 } },
    });
    expect(Number(created.metadata.resourceVersion)).toBeGreaterThan(rvBefore);
  });

  it('refuses a second process on the same state, and takes over a stale lock', async () => {
    const dir = await tempDir();
    const statePath = join(dir, 'state.json');
    await make({ statePath });
    const err = await createEmbeddedStore({ statePath }).catch((e) => e);
    expect(err).toBeInstanceOf(StateLockedError);
    expect(String(err.message)).toContain(`${statePath}.lock`);
    expect(String(err.message)).toContain(String(process.pid));

    const other = join(dir, 'other.json');
    const child = spawn(process.execPath, ['-e', '0']);
    const deadPid = child.pid as number;
    await new Promise((r) => child.on('exit', r));
    await writeFile(`${other}.lock`, `${deadPid}\n`);
    const s = await make({ statePath: other });
    expect(s.proxies.list()).toEqual([]);
  });

  it('ignores a torn last record and survives log compaction', async () => {
    const dir = await tempDir();
    const statePath = join(dir, 'state.json');
    const s1 = await make({ statePath, compactAfterRecords: 5 });
    for (let i = 0; i < 12; i++) {
      await s1.secrets.create({ metadata: { name: `s${i}`, namespace: 'ns' }, data: { k: 'dg==' } });
    }
    await s1.stop();
    open.splice(open.indexOf(s1), 1);
    const { appendFile, readFile } = await import('node:fs/promises');
    expect((await readFile(statePath, 'utf8')).split('\n').length).toBeLessThan(12);
    await appendFile(statePath, '{"rv":99,"r":"secrets","k":"ns/torn","o":{"metad');
    const s2 = await make({ statePath });
    expect((await s2.secrets.read({ namespace: 'ns', name: 's11' })).data).toEqual({ k: 'dg==' });
    expect(s2.engine.collection('secrets').list().items).toHaveLength(12);
    await s2.secrets.create({ metadata: { name: 'after', namespace: 'ns' } });
    await s2.stop();
    open.splice(open.indexOf(s2), 1);
    const s3 = await make({ statePath });
    expect(s3.engine.collection('secrets').list().items).toHaveLength(13);
  });

  it('rejects a corrupt state file with a clear error and releases the lock', async () => {
    const dir = await tempDir();
    const statePath = join(dir, 'state.json');
    await writeFile(statePath, 'not json\n{}\n');
    const err = await createEmbeddedStore({ statePath }).catch((e) => e);
    expect(String(err.message)).toContain(statePath);
    expect(String(err.message)).toContain('line 1');
    await writeFile(statePath, '{"hello":"world"}\n');
    const wrong = await createEmbeddedStore({ statePath }).catch((e) => e);
    expect(String(wrong.message)).toContain('not a standalone state file');
    // Deleting the file is how a fresh start is asked for.
    await unlink(statePath);
    const fresh = await make({ statePath });
    expect(fresh.proxies.list()).toEqual([]);
  });
});
