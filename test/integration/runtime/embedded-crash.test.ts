/**
 * kill -9 in the middle of writes loses no acknowledged write: a child process writes to the
 * standalone store from several concurrent writers and prints an ack after each write resolves;
 * we SIGKILL it mid-stream, reopen the state (taking over its stale lock) and check every ack.
 */
import { spawn } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import { createEmbeddedStore, StateLockedError } from '../../../src/runtime/embedded/index.ts';

const NODE = resolve('node_modules/.bin/node');
const ENTRY = pathToFileURL(resolve('src/runtime/embedded/index.ts')).href;

const CHILD = `
import { createEmbeddedStore } from ${JSON.stringify(ENTRY)};
const store = await createEmbeddedStore({ statePath: process.argv[2], rescanIntervalMs: 0 });
let n = 0;
async function writer(w) {
  for (;;) {
    const name = 'p-' + w + '-' + n++;
    await store.proxies.create({
      apiVersion: 'crawl.example.com/v1alpha1', kind: 'Proxy',
      metadata: { name, namespace: 'crash' },
      spec: { type: 'External', endpoint: { host: 'h', port: 1 } },
    });
    process.stdout.write('create ' + name + '\\n');
    for (let k = 1; k <= 3; k++) {
      await store.proxies.patchStatus({ namespace: 'crash', name }, { message: String(k) });
      process.stdout.write('status ' + name + ' ' + k + '\\n');
    }
    await store.secrets.create({ metadata: { name: name + '-auth', namespace: 'crash', labels: { 'crawl.example.com/credentials-for': name } }, data: { password: Buffer.from(name).toString('base64') } });
    process.stdout.write('secret ' + name + '\\n');
  }
}
process.stdout.write('ready\\n');
await Promise.all([0, 1, 2, 3].map(writer));
`;

describe('embedded store crash safety', () => {
  let dir = '';
  afterAll(async () => {
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  it('keeps every acknowledged write across SIGKILL', async () => {
    dir = await mkdtemp(join(tmpdir(), 'embedded-crash-'));
    const script = join(dir, 'child.mjs');
    const statePath = join(dir, 'state.json');
    await writeFile(script, CHILD);
    const child = spawn(NODE, [script, statePath], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    child.stderr.on('data', (d) => {
      err += d;
    });
    const exited = new Promise<NodeJS.Signals | null>((r) => child.on('exit', (_code, sig) => r(sig)));
    const lineCount = () => out.match(/\n/g)?.length ?? 0;
    let onLine = () => {};
    child.stdout.on('data', (d) => {
      out += d;
      onLine();
    });
    const waitLines = (n: number) =>
      new Promise<void>((res, rej) => {
        onLine = () => {
          if (lineCount() >= n) res();
        };
        onLine();
        child.on('exit', () => rej(new Error(`child exited early: ${err}`)));
      });
    await waitLines(50);
    // While the child runs, a second process on the same state is refused, naming the holder.
    const refused = await createEmbeddedStore({ statePath }).catch((e) => e);
    expect(refused).toBeInstanceOf(StateLockedError);
    expect(refused.pid).toBe(child.pid);
    await waitLines(300);
    child.kill('SIGKILL');
    onLine = () => {};
    expect(await exited).toBe('SIGKILL');
    const lines = out.split('\n').slice(0, -1); // the last piece may be a torn line
    const created = lines.filter((l) => l.startsWith('create ')).map((l) => l.slice(7));
    const statuses = new Map<string, number>();
    for (const l of lines.filter((x) => x.startsWith('status '))) {
      const [, name, k] = l.split(' ');
      statuses.set(name as string, Number(k));
    }
    const secrets = lines.filter((l) => l.startsWith('secret ')).map((l) => l.slice(7));
    expect(created.length).toBeGreaterThan(20);

    const store = await createEmbeddedStore({ statePath, rescanIntervalMs: 0 });
    try {
      for (const name of created) {
        const p = store.proxies.get({ namespace: 'crash', name });
        expect(p, name).toBeDefined();
      }
      for (const [name, k] of statuses) {
        const msg = Number(store.proxies.get({ namespace: 'crash', name })?.status?.message ?? 0);
        expect(msg, name).toBeGreaterThanOrEqual(k);
      }
      for (const name of secrets) {
        const s = await store.secrets.read({ namespace: 'crash', name: `${name}-auth` });
        expect(Buffer.from(s.data?.password ?? '', 'base64').toString()).toBe(name);
      }
      // The reopened state keeps working and keeps resourceVersions monotonic.
      const before = store.engine.resourceVersion;
      const p = await store.proxies.patchStatus(
        { namespace: 'crash', name: created[0] as string },
        { phase: 'Ready' },
      );
      expect(Number(p.metadata.resourceVersion)).toBeGreaterThan(before);
    } finally {
      await store.stop();
    }
  });
});
