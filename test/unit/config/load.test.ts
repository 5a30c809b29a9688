/**
 * test/unit/config/load — reading the providers config from disk: the shipped sample loads, YAML
 * mistakes and rule violations fail with every problem listed, warnings reach the log.
 */
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { Writable } from 'node:stream';
import { fileURLToPath } from 'node:url';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { bindProblem } from '../../../src/config/egress-addresses.ts';
import { loadProvidersConfig, ProvidersConfigError } from '../../../src/config/load.ts';

const root = join(dirname(fileURLToPath(import.meta.url)), '../../..');
let dir: string;

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'providers-config-'));
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

async function file(name: string, text: string): Promise<string> {
  const path = join(dir, name);
  await writeFile(path, text);
  return path;
}

async function failure(path: string): Promise<ProvidersConfigError> {
  const err = await loadProvidersConfig(path).catch((e: unknown) => e);
  expect(err).toBeInstanceOf(ProvidersConfigError);
  return err as ProvidersConfigError;
}

describe('loadProvidersConfig', () => {
  it('loads the shipped sample with all four provider types', async () => {
    const config = await loadProvidersConfig(join(root, 'config/samples/providers-config.yaml'));
    expect(config.providers.map((p) => `${p.name}:${p.type}`)).toEqual([
      'kubernetes:kubernetes',
      'gcp-main:gcp',
      'kvm-home:kvm',
      'local:local',
    ]);
    expect(config.providers[2]?.kvm?.hosts[0]?.name).toBe('nas1');
  });

  it('loads the standalone quick start config', async () => {
    const config = await loadProvidersConfig(join(root, 'examples/standalone/providers.yaml'));
    expect(config.providers.map((p) => p.type)).toContain('local');
  });

  it('names the egress addresses this machine cannot bind, and loads the ones it can', async () => {
    // 203.0.113.0/24 (TEST-NET-3) is documentation space; 127.0.0.0/8 all binds.
    const taken = (await Promise.all(['203.0.113.1', '203.0.113.7'].map(bindProblem))).filter((c) => !c);
    expect(taken, 'this test needs 203.0.113.0/24 (TEST-NET-3) on no interface of this machine').toEqual([]);
    const listed = await failure(
      await file(
        'unbindable.yaml',
        'providers:\n  - name: fleet\n    type: local\n    local:\n      egressAddresses: [127.0.0.2, 203.0.113.7, 127.0.0.3]\n',
      ),
    );
    expect(listed.issues).toHaveLength(1);
    expect(listed.message).toContain(
      'providers[0] (fleet): local.egressAddresses[1] "203.0.113.7" cannot be bound on this machine (EADDRNOTAVAIL)',
    );
    expect(listed.issues[0]?.path).toBe('providers[0].local.egressAddresses[1]');

    const block = await failure(
      await file(
        'unbindable-block.yaml',
        'providers:\n  - name: fleet\n    type: local\n    local:\n      egressAddresses: {cidr: 203.0.113.0/24, count: 40}\n',
      ),
    );
    expect(block.message).toContain(
      'local.egressAddresses: 40 of 40 addresses cannot be bound on this machine: 203.0.113.1 (EADDRNOTAVAIL), 203.0.113.2 (EADDRNOTAVAIL)',
    );
    expect(block.message).toContain('and 30 more');

    const fine = await loadProvidersConfig(
      await file(
        'bindable.yaml',
        'providers:\n  - name: fleet\n    type: local\n    local:\n      egressAddresses: {cidr: 127.0.0.0/29, count: 6}\n',
      ),
    );
    expect(fine.providers[0]?.local?.egressAddresses).toEqual({ cidr: '127.0.0.0/29', count: 6 });
  });

  it('reads JSON too', async () => {
    const path = await file('p.json', JSON.stringify({ providers: [{ name: 'local', type: 'local' }] }));
    expect(await loadProvidersConfig(path)).toEqual({ providers: [{ name: 'local', type: 'local' }] });
  });

  it('lists every problem, one line each, naming the file and fields', async () => {
    const path = await file(
      'bad.yaml',
      [
        'providers:',
        '  - name: kvm-home',
        '    type: kvm',
        '    kvm:',
        '      sshKeyFile: /key',
        '      knownHostsFile: /kh',
        '      machineTypes: {small: {vcpus: 1, memoryMiB: 1024}}',
        '      hosts:',
        '        - {name: nas1, address: "nas1:22", user: virt, bridge: br0}',
        '        - {name: dc1/rack2, address: "b:22", user: virt, bridge: br0}',
        '  - name: local',
        '    type: local',
        '    local: {portRange: {from: 30000, to: 20000}}',
        '',
      ].join('\n'),
    );
    const err = await failure(path);
    expect(err.issues.map((i) => i.path)).toEqual([
      'providers[0].kvm.hosts[1].name',
      'providers[1].local.portRange',
    ]);
    expect(err.message.split('\n')).toEqual([
      `invalid providers config ${path}:`,
      'providers[0] (kvm-home): kvm.hosts[1].name "dc1/rack2" must be letters, digits, dots, dashes or underscores — it becomes part of the providerID hosts/<name>/domains/<vm>',
      'providers[1] (local): local.portRange from (30000) must not be greater than to (20000)',
    ]);
  });

  it('rejects YAML syntax errors with their position', async () => {
    const err = await failure(await file('syntax.yaml', 'providers:\n  - name: a\n    type: [local\n'));
    expect(err.message).toMatch(/YAML: .*line \d+/);
  });

  it('rejects duplicate keys instead of silently keeping the last', async () => {
    const err = await failure(
      await file('dup.yaml', 'providers:\n  - name: a\n    name: b\n    type: local\n'),
    );
    expect(err.message).toMatch(/YAML: .*unique/i);
  });

  it('rejects an empty file', async () => {
    const err = await failure(await file('empty.yaml', ''));
    expect(err.message).toContain('providers config must be an object');
  });

  it('fails with the file system error when the file is missing', async () => {
    await expect(loadProvidersConfig(join(dir, 'nope.yaml'))).rejects.toMatchObject({ code: 'ENOENT' });
  });

  it('logs warnings without failing', async () => {
    const lines: string[] = [];
    const sink = new Writable({
      write(chunk, _enc, cb) {
        lines.push(String(chunk));
        cb();
      },
    });
    const path = await file('warn.yaml', 'providers:\n  - {name: Local_Dev, type: local}\n');
    const config = await loadProvidersConfig(path, { logger: pino(sink) });
    expect(config.providers).toHaveLength(1);
    expect(lines).toHaveLength(1);
    // `log`, the name every other component takes its logger by, works the same.
    await loadProvidersConfig(path, { log: pino(sink) });
    expect(lines).toHaveLength(2);
    expect(JSON.parse(lines[1]!)).toMatchObject({ level: 40, field: 'providers[0].name' });
    expect(JSON.parse(lines[0]!)).toMatchObject({ level: 40, field: 'providers[0].name' });
    expect(lines[0]).toContain('no ProviderHealth object');
  });
});
