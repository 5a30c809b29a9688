/**
 * The NoCloud seed: user-data byte for byte, meta-data as cloud-init's YAML 1.1 reads it,
 * vendor-data (guest-agent script, MIME multipart), checked in the ISO with isoinfo, and the
 * script itself run by /bin/sh against stub package managers.
 */

import { execFileSync, spawnSync } from 'node:child_process';
import { chmodSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { gzipSync } from 'node:zlib';
import { afterAll, describe, expect, it } from 'vitest';
import { parse } from 'yaml';
import { classify } from '../../../src/provider/errors.ts';
import {
  buildSeed,
  GUEST_AGENT_SCRIPT,
  renderMetaData,
  SeedInputError,
  type SeedOptions,
} from '../../../src/provider/kvm/seed.ts';

const dir = mkdtempSync(join(tmpdir(), 'kvm-seed-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

let counter = 0;
function isoPath(iso: Buffer): string {
  const p = join(dir, `seed${counter++}.iso`);
  writeFileSync(p, iso);
  return p;
}

function extract(path: string, ext: '-R' | '-J', name: string): Buffer {
  return execFileSync('isoinfo', [ext, '-x', `/${name}`, '-i', path], { maxBuffer: 16 << 20 });
}

function listNames(path: string): string[] {
  const out = execFileSync('isoinfo', ['-R', '-l', '-i', path], { encoding: 'utf8' });
  return out
    .split('\n')
    .map((l) => /\]\s+(\S+) ?$/.exec(l)?.[1])
    .filter((n): n is string => n !== undefined && n !== '.' && n !== '..')
    .sort();
}

function fileOf(seed: ReturnType<typeof buildSeed>, name: string): Buffer | undefined {
  return seed.files.find((f) => f.name === name)?.data;
}

const base: SeedOptions = { instanceId: 'proxy-a-1b2c3', hostname: 'proxy-a', userData: '#cloud-config\n' };

// ---- a small MIME reader, enough to check the multipart the way cloud-init's email parser sees it
interface MimePart {
  headers: Map<string, string>;
  body: string;
}

function parseHeaders(block: string): Map<string, string> {
  const headers = new Map<string, string>();
  for (const line of block.split('\n')) {
    const i = line.indexOf(':');
    if (i > 0) headers.set(line.slice(0, i).trim().toLowerCase(), line.slice(i + 1).trim());
  }
  return headers;
}

function parseMultipart(text: string): { headers: Map<string, string>; parts: MimePart[] } {
  const split = text.indexOf('\n\n');
  const headers = parseHeaders(text.slice(0, split));
  const boundary = /boundary="([^"]+)"/.exec(headers.get('content-type') ?? '')?.[1];
  if (!boundary) throw new Error('no boundary');
  const body = text.slice(split + 2);
  const close = body.indexOf(`\n--${boundary}--`);
  if (close < 0) throw new Error('no closing boundary');
  const sections = body.slice(0, close).split(`--${boundary}\n`);
  expect(sections[0]!.trim()).toBe(''); // nothing but the preamble before the first boundary
  const parts = sections.slice(1).map((s) => {
    const at = s.indexOf('\n\n');
    return { headers: parseHeaders(s.slice(0, at)), body: s.slice(at + 2) };
  });
  return { headers, parts };
}

function decodePart(p: MimePart): string {
  expect(p.headers.get('content-transfer-encoding')).toBe('base64');
  return Buffer.from(p.body.replace(/\s+/g, ''), 'base64').toString('utf8');
}

describe('buildSeed files', () => {
  it('writes user-data byte for byte whatever its format, in the files and in the ISO', () => {
    const formats: Array<string | Buffer> = [
      '#cloud-config\n# comment kept\nversion: 1.10\npackages: [squid]\nwrite_files:\n- content: "x: y"\n',
      '#!/bin/bash\necho hi\r\necho "no trailing newline"',
      '## template: jinja\n#cloud-config\nhostname: {{ v1.local_hostname }}\n',
      'Content-Type: multipart/mixed; boundary="XX"\nMIME-Version: 1.0\n\n--XX\nContent-Type: text/x-shellscript\n\n#!/bin/sh\n--XX--\n',
      gzipSync(Buffer.from('#cloud-config\nruncmd: [true]\n')),
      `#cloud-config\nbig: "${'z'.repeat(9000)}"\n`,
      '',
    ];
    for (const userData of formats) {
      const seed = buildSeed({ ...base, userData });
      const want = typeof userData === 'string' ? Buffer.from(userData, 'utf8') : userData;
      expect(fileOf(seed, 'user-data')!.equals(want)).toBe(true);
      const p = isoPath(seed.iso);
      expect(extract(p, '-R', 'user-data').equals(want)).toBe(true);
      expect(extract(p, '-J', 'user-data').equals(want)).toBe(true);
    }
  });

  it('labels the ISO cidata and names the files as NoCloud expects, under both extensions', () => {
    const p = isoPath(buildSeed(base).iso);
    const info = execFileSync('isoinfo', ['-d', '-i', p], { encoding: 'utf8' });
    expect(info).toMatch(/^Volume id: cidata$/m);
    expect(info).toContain('Rock Ridge signatures version 1 found');
    expect(info).toContain('Joliet with UCS level 3 found');
    expect(listNames(p)).toEqual(['meta-data', 'user-data', 'vendor-data']);
    expect(extract(p, '-J', 'meta-data').toString()).toBe(
      'instance-id: proxy-a-1b2c3\nlocal-hostname: proxy-a\n',
    );
  });

  it('renders meta-data with instance-id and local-hostname', () => {
    const seed = buildSeed(base);
    expect(fileOf(seed, 'meta-data')!.toString()).toBe(
      'instance-id: proxy-a-1b2c3\nlocal-hostname: proxy-a\n',
    );
  });

  it('quotes meta-data values YAML 1.1 would otherwise read as numbers, booleans or null', () => {
    for (const [instanceId, hostname] of [
      ['123', '0755'],
      ['1e5', 'yes'],
      ['on', 'null'],
      ['12:30', '1.10'],
      ['a.b-c_d', 'host.example.com'],
    ] as const) {
      const text = renderMetaData(instanceId, hostname);
      expect(text.split('\n')).toHaveLength(3);
      expect(parse(text, { version: '1.1' })).toEqual({
        'instance-id': instanceId,
        'local-hostname': hostname,
      });
    }
  });

  it('is deterministic', () => {
    const opts = { ...base, vendorData: '#cloud-config\nntp: {enabled: true}\n' };
    expect(buildSeed(opts).iso.equals(buildSeed(opts).iso)).toBe(true);
  });
});

describe('buildSeed vendor-data', () => {
  it('ships the guest-agent script by default', () => {
    const vendor = fileOf(buildSeed(base), 'vendor-data')!.toString();
    expect(vendor).toBe(GUEST_AGENT_SCRIPT);
    expect(vendor.startsWith('#!/bin/sh\n')).toBe(true);
  });

  it('ships no vendor-data when the agent is off and nothing is configured', () => {
    for (const vendorData of [undefined, '']) {
      const seed = buildSeed({ ...base, installGuestAgent: false, vendorData });
      expect(seed.files.map((f) => f.name)).toEqual(['user-data', 'meta-data']);
      expect(listNames(isoPath(seed.iso))).toEqual(['meta-data', 'user-data']);
    }
  });

  it('ships configured vendor-data unchanged when the agent is off', () => {
    const vendorData = '#cloud-config\nruncmd: [[touch, /vendor]]\n';
    const seed = buildSeed({ ...base, installGuestAgent: false, vendorData });
    expect(fileOf(seed, 'vendor-data')!.toString()).toBe(vendorData);
  });

  it('combines configured vendor-data and the script into a multipart cloud-init accepts', () => {
    const vendorData = '#cloud-config\nwrite_files:\n- path: /etc/x\n  content: "--boundary-lookalike\\n"\n';
    const seed = buildSeed({ ...base, vendorData });
    const text = extract(isoPath(seed.iso), '-R', 'vendor-data').toString();
    expect(text).toBe(fileOf(seed, 'vendor-data')!.toString());
    // cloud-init treats the payload as MIME when "mime-version:" is within its first 4096 bytes.
    expect(text.slice(0, 4096).toLowerCase()).toContain('mime-version: 1.0');
    const { headers, parts } = parseMultipart(text);
    expect(headers.get('content-type')).toMatch(/^multipart\/mixed; boundary="/);
    expect(parts).toHaveLength(2);
    expect(parts[0]!.headers.get('content-type')).toBe('text/plain; charset="utf-8"');
    expect(decodePart(parts[0]!)).toBe(vendorData);
    expect(parts[1]!.headers.get('content-type')).toBe('text/x-shellscript; charset="utf-8"');
    expect(parts[1]!.headers.get('content-disposition')).toBe(
      'attachment; filename="install-qemu-guest-agent.sh"',
    );
    expect(decodePart(parts[1]!)).toBe(GUEST_AGENT_SCRIPT);
  });

  // cloud-init re-detects the type of a text/plain part from its first line but takes a declared
  // text/cloud-config at its word: declaring it ourselves mis-types the documents whose header
  // merely starts with "#cloud-config".
  it.each([
    ['a script', '#!/bin/bash\necho vendor\n'],
    [
      'a cloud-config archive',
      '#cloud-config-archive\n- type: text/cloud-config\n  content: "runcmd: [true]"\n',
    ],
    ['a cloud-config jsonp', '#cloud-config-jsonp\n[{"op": "add", "path": "/runcmd", "value": []}]\n'],
  ])(
    'declares configured vendor-data (%s) text/plain so cloud-init detects its type itself',
    (_what, vendorData) => {
      const { parts } = parseMultipart(fileOf(buildSeed({ ...base, vendorData }), 'vendor-data')!.toString());
      expect(parts[0]!.headers.get('content-type')).toBe('text/plain; charset="utf-8"');
      expect(decodePart(parts[0]!)).toBe(vendorData);
    },
  );
});

describe('guest-agent script', () => {
  it('is valid POSIX sh', () => {
    const p = join(dir, 'agent.sh');
    writeFileSync(p, GUEST_AGENT_SCRIPT);
    expect(spawnSync('/bin/sh', ['-n', p]).status).toBe(0);
  });

  /** Runs the script with PATH holding only the given stubs; each stub logs its argv. */
  function runWithStubs(stubs: Record<string, string>): {
    status: number | null;
    calls: string[];
    output: string;
  } {
    const bin = mkdtempSync(join(dir, 'bin-'));
    const log = join(bin, 'calls.log');
    writeFileSync(log, '');
    const all: Record<string, string> = { sleep: '', ...stubs };
    for (const [name, extra] of Object.entries(all)) {
      const p = join(bin, name);
      writeFileSync(
        p,
        `#!/bin/sh\necho "${name} $*" >> "${log}"\n${extra.replaceAll('@BIN@', bin)}\nexit 0\n`,
      );
      chmodSync(p, 0o755);
    }
    const script = join(bin, 'agent.sh');
    writeFileSync(script, GUEST_AGENT_SCRIPT);
    const r = spawnSync('/bin/sh', [script], { env: { PATH: bin }, encoding: 'utf8' });
    const calls = readFileSync(log, 'utf8').split('\n').filter(Boolean);
    return { status: r.status, calls, output: r.stdout + r.stderr };
  }

  // The install stub drops a qemu-ga binary next to itself, like the real package would.
  const installs = () => 'case "$*" in *install*|*add*) /bin/cp "@BIN@/sleep" "@BIN@/qemu-ga";; esac';

  it('installs with apt-get and starts the agent with systemd', () => {
    const r = runWithStubs({ 'apt-get': installs(), systemctl: '' });
    expect(r.status).toBe(0);
    expect(r.calls).toEqual([
      'apt-get -o DPkg::Lock::Timeout=120 update -q',
      'apt-get -o DPkg::Lock::Timeout=120 install -y -q qemu-guest-agent',
      'systemctl enable qemu-guest-agent',
      'systemctl start qemu-guest-agent',
    ]);
  });

  it('prefers what the image has: dnf, zypper, apk with OpenRC', () => {
    expect(runWithStubs({ dnf: installs(), yum: '', systemctl: '' }).calls).toEqual([
      'dnf install -y qemu-guest-agent',
      'systemctl enable qemu-guest-agent',
      'systemctl start qemu-guest-agent',
    ]);
    expect(runWithStubs({ zypper: installs(), systemctl: '' }).calls[0]).toBe(
      'zypper --non-interactive install qemu-guest-agent',
    );
    const alpine = runWithStubs({ apk: installs(), 'rc-update': '', 'rc-service': '' });
    expect(alpine.status).toBe(0);
    expect(alpine.calls).toEqual([
      'apk add --no-cache qemu-guest-agent',
      'rc-update add qemu-guest-agent default',
      'rc-service qemu-guest-agent start',
    ]);
  });

  it('installs nothing when the agent is already there, and still starts it', () => {
    const r = runWithStubs({ 'apt-get': '', systemctl: '', 'qemu-ga': '' });
    expect(r.status).toBe(0);
    expect(r.calls).toEqual(['systemctl enable qemu-guest-agent', 'systemctl start qemu-guest-agent']);
  });

  it('retries a failing install and then fails loudly', () => {
    const r = runWithStubs({ 'apt-get': 'exit 100', systemctl: '' });
    expect(r.status).not.toBe(0);
    expect(r.calls.filter((c) => c.includes('install -y')).length).toBe(5);
    expect(r.calls).not.toContain('systemctl start qemu-guest-agent');
    expect(r.output).toContain('apt-get install failed');
  });

  it('fails with a clear message when no package manager is present', () => {
    const r = runWithStubs({});
    expect(r.status).not.toBe(0);
    expect(r.output).toContain('no supported package manager');
    expect(r.calls).toEqual([]);
  });
});

describe('buildSeed validation', () => {
  const secret = '#cloud-config\npassword: s3cr3t-value\n';
  const cases: Array<[string, Partial<SeedOptions>, string]> = [
    ['a hostname with an underscore', { hostname: 'bad_host' }, 'hostname'],
    ['a hostname label over 63 characters', { hostname: `${'a'.repeat(64)}.example` }, 'hostname'],
    ['an empty hostname', { hostname: '' }, 'hostname'],
    ['an instance id that would inject YAML', { instanceId: 'x\nlocal-hostname: evil' }, 'instanceId'],
    ['an empty instance id', { instanceId: '' }, 'instanceId'],
    ['userData of the wrong type', { userData: 42 as unknown as string }, 'userData'],
  ];
  for (const [label, patch, field] of cases) {
    it(`rejects ${label} naming ${field}, without echoing user-data`, () => {
      let err: unknown;
      try {
        buildSeed({ ...base, userData: secret, ...patch });
      } catch (e) {
        err = e;
      }
      expect(err).toBeInstanceOf(SeedInputError);
      expect((err as SeedInputError).field).toBe(field);
      expect((err as Error).message.startsWith(`${field}: `)).toBe(true);
      expect((err as Error).message).not.toContain('s3cr3t');
      expect(classify(err)).toBe('Permanent');
    });
  }
});
