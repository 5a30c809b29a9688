/**
 * The standalone installation id lives in the state file: generated for a new state and kept
 * through restarts and compactions, moved in from an older build's `<state>.installation-id`,
 * and a state that holds objects without it is refused rather than started as a new
 * installation. Also the state directory: created 0700, a group- or world-readable one named.
 */
import { existsSync, statSync } from 'node:fs';
import { chmod, mkdir, mkdtemp, readFile, rm, unlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import {
  createEmbeddedStore,
  type EmbeddedStore,
  StateFileError,
} from '../../../src/runtime/embedded/index.ts';
import { legacyInstallationIdPath } from '../../../src/runtime/embedded/installation.ts';
import { captureLog } from '../../support/log.ts';

const dirs: string[] = [];
const open: EmbeddedStore[] = [];
afterEach(async () => {
  for (const s of open.splice(0)) await s.stop();
  for (const d of dirs.splice(0)) await rm(d, { recursive: true, force: true });
});

async function tempDir(): Promise<string> {
  const d = await mkdtemp(join(tmpdir(), 'embedded-installation-'));
  dirs.push(d);
  return d;
}

async function make(opts: Parameters<typeof createEmbeddedStore>[0]): Promise<EmbeddedStore> {
  const s = await createEmbeddedStore({ rescanIntervalMs: 0, ...opts });
  open.push(s);
  return s;
}

async function stop(s: EmbeddedStore): Promise<void> {
  await s.stop();
  open.splice(open.indexOf(s), 1);
}

const proxyYaml = (name: string) => `apiVersion: crawl.example.com/v1alpha1
kind: Proxy
metadata: {name: ${name}}
spec:
  type: External
  endpoint: {host: 203.0.113.7, port: 8080}
`;

/** A state dir with one manifest Proxy, so the state holds objects once opened. */
async function withProxy(): Promise<{ statePath: string; manifests: string }> {
  const dir = await tempDir();
  const manifests = join(dir, 'proxies');
  await mkdir(manifests);
  await writeFile(join(manifests, 'a.yaml'), proxyYaml('a'));
  return { statePath: join(dir, 'state.json'), manifests };
}

async function snapshotLine(statePath: string): Promise<Record<string, unknown>> {
  const first = (await readFile(statePath, 'utf8')).split('\n')[0] as string;
  return JSON.parse(first) as Record<string, unknown>;
}

/** What an older build left: the same state without the id in its snapshot line. */
async function stripId(statePath: string): Promise<void> {
  const lines = (await readFile(statePath, 'utf8')).split('\n');
  const header = JSON.parse(lines[0] as string) as Record<string, unknown>;
  delete header.installation;
  lines[0] = JSON.stringify(header);
  await writeFile(statePath, lines.join('\n'));
}

describe('standalone installation id', () => {
  it('is generated for a new state, written in every snapshot, and kept across restarts', async () => {
    const { statePath, manifests } = await withProxy();
    const first = await make({ statePath, manifests, compactAfterRecords: 2 });
    expect(first.installation.source).toBe('generated');
    const id = first.installation.id;
    expect(id).toMatch(/^[0-9a-f-]{36}$/);
    expect((await snapshotLine(statePath)).installation).toBe(id);
    // Enough writes to compact the journal: the rewritten snapshot keeps the id.
    for (let i = 0; i < 5; i++) {
      await first.proxies.patchStatus({ namespace: 'default', name: 'a' }, { observedGeneration: i });
    }
    await first.flush();
    expect((await snapshotLine(statePath)).installation).toBe(id);
    await stop(first);
    // The copy beside it, for `cat`.
    expect((await readFile(legacyInstallationIdPath(statePath), 'utf8')).trim()).toBe(id);

    const again = await make({ statePath, manifests });
    expect(again.installation).toMatchObject({ id, source: 'state' });
    await stop(again);
    // Losing the copy loses nothing: it is written again.
    await unlink(legacyInstallationIdPath(statePath));
    await stop(await make({ statePath, manifests }));
    expect((await readFile(legacyInstallationIdPath(statePath), 'utf8')).trim()).toBe(id);
    // Starting over deliberately (state file deleted) stays the same installation, so the
    // orphan collector still recognises the old instances.
    await unlink(statePath);
    const fresh = await make({ statePath, manifests });
    expect(fresh.installation).toMatchObject({ id, source: 'legacy-file' });
    await stop(fresh);
    // Another state file is another installation.
    const other = await make({ statePath: join(await tempDir(), 'state.json') });
    expect(other.installation.id).not.toBe(id);
  });

  it("moves an older build's <state>.installation-id into the state, which then no longer needs the file", async () => {
    const { statePath, manifests } = await withProxy();
    await stop(await make({ statePath, manifests }));
    await stripId(statePath);
    await writeFile(legacyInstallationIdPath(statePath), 'old-installation-1\n');
    const c = captureLog();
    const migrated = await make({ statePath, manifests, log: c.log });
    expect(migrated.installation).toMatchObject({ id: 'old-installation-1', source: 'legacy-file' });
    expect((await snapshotLine(statePath)).installation).toBe('old-installation-1');
    expect(c.lines.some((l) => l.msg === 'installation id is now kept in the state file')).toBe(true);
    await stop(migrated);

    await unlink(legacyInstallationIdPath(statePath));
    expect((await make({ statePath, manifests })).installation.id).toBe('old-installation-1');
  });

  it('refuses a state that holds objects but no id, naming the file and the way back, and changes nothing', async () => {
    const { statePath, manifests } = await withProxy();
    await stop(await make({ statePath, manifests }));
    await stripId(statePath);
    await unlink(legacyInstallationIdPath(statePath));
    const before = await readFile(statePath, 'utf8');
    const err = await createEmbeddedStore({ statePath, manifests, rescanIntervalMs: 0 }).catch(
      (e: Error) => e,
    );
    expect(err).toBeInstanceOf(Error);
    const msg = (err as Error).message;
    expect(msg).toContain(`state file ${statePath} holds 1 object(s) but no installation id`);
    expect(msg).toContain(`Restore ${legacyInstallationIdPath(statePath)}`);
    expect(msg).toContain('--installation-id <id>');
    expect(await readFile(statePath, 'utf8')).toBe(before);
    expect(existsSync(`${statePath}.lock`)).toBe(false);

    // Passing the old id is the way back: it is kept from then on.
    const back = await make({ statePath, manifests, installationId: 'the-old-one' });
    expect(back.installation).toMatchObject({ id: 'the-old-one', source: 'flag' });
    await stop(back);
    expect((await make({ statePath, manifests })).installation).toMatchObject({
      id: 'the-old-one',
      source: 'state',
    });
  });

  it('takes --installation-id for a new state, then refuses a different one naming both', async () => {
    const { statePath, manifests } = await withProxy();
    const s = await make({ statePath, manifests, installationId: 'team-a' });
    expect(s.installation).toMatchObject({ id: 'team-a', source: 'flag' });
    await stop(s);
    const same = await make({ statePath, manifests, installationId: 'team-a' });
    expect(same.installation).toMatchObject({ id: 'team-a', source: 'state' });
    await stop(same);
    const before = await readFile(statePath, 'utf8');
    await expect(
      createEmbeddedStore({ statePath, manifests, rescanIntervalMs: 0, installationId: 'team-b' }),
    ).rejects.toThrow(
      `--installation-id team-b disagrees with the installation id team-a kept in state file ${statePath}`,
    );
    expect(await readFile(statePath, 'utf8')).toBe(before);
  });

  it('prefers --installation-id over a disagreeing legacy file when moving the id in, and says so', async () => {
    const { statePath, manifests } = await withProxy();
    await stop(await make({ statePath, manifests }));
    await stripId(statePath);
    await writeFile(legacyInstallationIdPath(statePath), 'from-file\n');
    const c = captureLog();
    const s = await make({ statePath, manifests, installationId: 'from-flag', log: c.log });
    expect(s.installation.id).toBe('from-flag');
    const warning = c.lines.find((l) => l.level === 40);
    expect(warning?.msg).toContain(`${legacyInstallationIdPath(statePath)} held from-file and is rewritten`);
    expect((await readFile(legacyInstallationIdPath(statePath), 'utf8')).trim()).toBe('from-flag');
  });

  it('refuses a malformed id in the state file or in a legacy file, naming the file', async () => {
    const { statePath, manifests } = await withProxy();
    await stop(await make({ statePath, manifests }));
    const text = await readFile(statePath, 'utf8');
    await writeFile(statePath, text.replace(/"installation":"[^"]+"/, '"installation":"Not An Id"'));
    const bad = await createEmbeddedStore({ statePath, manifests }).catch((e: Error) => e);
    expect(bad).toBeInstanceOf(StateFileError);
    expect((bad as Error).message).toMatch(
      new RegExp(
        `^state file ${statePath}: line 1: installation: "Not An Id" is not a valid installation id`,
      ),
    );

    await writeFile(statePath, text);
    await stripId(statePath);
    await writeFile(legacyInstallationIdPath(statePath), '  \n');
    await expect(createEmbeddedStore({ statePath, manifests })).rejects.toThrow(
      `installation id file ${legacyInstallationIdPath(statePath)}`,
    );
  });
});

describe('standalone state directory', () => {
  it('is created 0700, parents included', async () => {
    const dir = join(await tempDir(), 'a', 'b');
    await make({ statePath: join(dir, 'state.json') });
    expect(statSync(dir).mode & 0o777).toBe(0o700);
    expect(statSync(join(dir, '..')).mode & 0o777).toBe(0o700);
    expect(statSync(join(dir, 'state.json')).mode & 0o777).toBe(0o600);
  });

  it('is left as the user made it when open to others, with a warning naming it', async () => {
    const dir = join(await tempDir(), 'shared');
    await mkdir(dir);
    await chmod(dir, 0o755);
    const c = captureLog();
    await make({ statePath: join(dir, 'state.json'), log: c.log });
    expect(statSync(dir).mode & 0o777).toBe(0o755);
    const warnings = c.lines.filter((l) => l.level === 40);
    expect(warnings).toHaveLength(1);
    expect(warnings[0]).toMatchObject({ stateDir: dir, mode: '0755' });
    expect(warnings[0]?.msg).toContain(`state directory ${dir} is open to group or others`);

    const quiet = captureLog();
    const privateDir = join(await tempDir(), 'private');
    await mkdir(privateDir, { mode: 0o700 });
    await make({ statePath: join(privateDir, 'state.json'), log: quiet.log });
    expect(quiet.lines.filter((l) => l.level === 40)).toEqual([]);
  });
});
