/**
 * `check-config`: the providers config checked as a start would check it, connecting nowhere —
 * what docs/deployment.md runs before `kubectl apply`.
 */
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { PassThrough } from 'node:stream';
import { describe, expect, it } from 'vitest';
import { checkProvidersConfig } from '../../../src/cmd/check-config.ts';
import { parseCommandLine } from '../../../src/cmd/flags.ts';

function capture(): { stream: PassThrough; text: () => string } {
  const stream = new PassThrough();
  const chunks: Buffer[] = [];
  stream.on('data', (c: Buffer) => chunks.push(c));
  return { stream, text: () => Buffer.concat(chunks).toString('utf8') };
}

async function check(yaml: string | undefined): Promise<{ code: number; out: string; err: string }> {
  const dir = mkdtempSync(join(tmpdir(), 'check-config-'));
  const file = join(dir, 'providers.yaml');
  if (yaml !== undefined) writeFileSync(file, yaml);
  const out = capture();
  const err = capture();
  const code = await checkProvidersConfig(file, out.stream, err.stream);
  return { code, out: out.text(), err: err.text() };
}

describe('check-config', () => {
  it('is a command of its own, needing --providers-config', () => {
    expect(parseCommandLine(['check-config', '--providers-config', 'p.yaml'])).toEqual({
      command: 'check-config',
      providersConfig: 'p.yaml',
    });
    expect(() => parseCommandLine(['check-config'])).toThrow(/--providers-config is required/);
  });

  it('says OK for a valid file and exits 0', async () => {
    const r = await check('providers:\n  - name: pods\n    type: kubernetes\n');
    expect(r).toMatchObject({ code: 0, out: 'providers config OK\n' });
  });

  it('names every problem by its field and exits 2', async () => {
    const r = await check(
      'providers:\n  - name: pods\n    type: kubernetes\n    kubernetes: {namespce: x}\n',
    );
    expect(r.code).toBe(2);
    expect(r.out).toBe('');
    expect(r.err).toMatch(/invalid providers config/);
    expect(r.err).toMatch(/namespce/);
  });

  it('exits 2 naming the file when it cannot be read', async () => {
    const r = await check(undefined);
    expect(r.code).toBe(2);
    expect(r.err).toMatch(/providers\.yaml: .*ENOENT/);
  });
});
