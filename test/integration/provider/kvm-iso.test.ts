/**
 * The ISO 9660 writer, read back by independent implementations: genisoimage's `isoinfo`,
 * libisofs through `xorriso`, and util-linux `blkid`.
 */

import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { classify } from '../../../src/provider/errors.ts';
import { buildIso, type IsoFile, IsoInputError, SECTOR_SIZE } from '../../../src/provider/kvm/iso9660.ts';

const dir = mkdtempSync(join(tmpdir(), 'kvm-iso-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

let counter = 0;
function writeIso(iso: Buffer): string {
  const path = join(dir, `t${counter++}.iso`);
  writeFileSync(path, iso);
  return path;
}

function run(cmd: string, args: string[]): string {
  return execFileSync(cmd, args, { encoding: 'utf8', env: { ...process.env, LC_ALL: 'C.UTF-8' } });
}

function runBytes(cmd: string, args: string[]): Buffer {
  return execFileSync(cmd, args, { maxBuffer: 64 << 20 });
}

interface Listed {
  name: string;
  size: number;
  mode: string;
}

/** `isoinfo -l` rows of the root, without `.` and `..`. */
function isoinfoList(path: string, ext: '-R' | '-J' | null): Listed[] {
  const out = run('isoinfo', [...(ext ? [ext] : []), '-l', '-i', path]);
  const rows: Listed[] = [];
  for (const line of out.split('\n')) {
    const m = /^(\S{10})\s+\d+\s+\d+\s+\d+\s+(\d+)\s+\w{3}\s+\d+\s+\d{4}\s+\[\s*\d+\s+\d+\]\s+(.*?) ?$/.exec(
      line,
    );
    if (m && m[3] !== '.' && m[3] !== '..') rows.push({ mode: m[1]!, size: Number(m[2]), name: m[3]! });
  }
  return rows.sort((a, b) => (a.name < b.name ? -1 : 1));
}

/** `xorriso … -find / -exec lsdl` rows of the root's files. */
function xorrisoList(path: string, readFs: 'any' | 'norock'): Listed[] {
  const out = execFileSync(
    'xorriso',
    ['-read_fs', readFs, '-indev', path, '-find', '/', '-type', 'f', '-exec', 'lsdl'],
    {
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'pipe'],
    },
  );
  const rows: Listed[] = [];
  for (const line of out.split('\n')) {
    const m = /^(\S{10})\s+\d+\s+\S+\s+\S+\s+(\d+)\s+\w{3}\s+\d+\s+\d+\s+'\/(.*)'$/.exec(line);
    if (m) rows.push({ mode: m[1]!, size: Number(m[2]), name: m[3]! });
  }
  return rows.sort((a, b) => (a.name < b.name ? -1 : 1));
}

function bytesOf(data: IsoFile['data']): Buffer {
  return typeof data === 'string' ? Buffer.from(data, 'utf8') : Buffer.from(data);
}

function expected(files: IsoFile[]): Listed[] {
  return files
    .map((f) => ({ name: f.name, size: bytesOf(f.data).length, mode: '-r--r--r--' }))
    .sort((a, b) => (a.name < b.name ? -1 : 1));
}

// A NoCloud-like set with the awkward cases: binary bytes, a file spanning five sectors plus a
// partial one, a file of exactly one sector, and an empty file.
const binary = Buffer.alloc(10 * 1024 + 7);
for (let i = 0; i < binary.length; i++) binary[i] = (i * 131 + (i >> 8)) & 0xff;
const seedFiles: IsoFile[] = [
  { name: 'user-data', data: '#cloud-config\npackages: [squid]\n' },
  { name: 'meta-data', data: 'instance-id: vm-1\nlocal-hostname: vm-1\n' },
  { name: 'vendor-data', data: binary },
  { name: 'network-config', data: Buffer.alloc(SECTOR_SIZE, 0x41) },
  { name: 'empty', data: '' },
];

describe('buildIso read back by isoinfo, xorriso and blkid', () => {
  const iso = buildIso({ volumeId: 'cidata', files: seedFiles });
  const path = writeIso(iso);

  it('has the volume id, both name extensions and a size matching the volume descriptor', () => {
    const info = run('isoinfo', ['-d', '-i', path]);
    expect(info).toContain('CD-ROM is in ISO 9660 format');
    expect(info).toMatch(/^Volume id: cidata$/m);
    expect(info).toContain('Joliet with UCS level 3 found');
    expect(info).toContain('Rock Ridge signatures version 1 found');
    expect(info).toMatch(/^Logical block size is: 2048$/m);
    const sectors = Number(/^Volume size is: (\d+)$/m.exec(info)![1]);
    expect(sectors * SECTOR_SIZE).toBe(iso.length);
  });

  it('is recognised by blkid as an iso9660 filesystem labelled cidata', () => {
    const out = run('blkid', ['-p', '-o', 'export', path]);
    expect(out).toMatch(/^TYPE=iso9660$/m);
    expect(out).toMatch(/^LABEL=cidata$/m);
  });

  it('lists every file with its exact name and size under Rock Ridge and under Joliet', () => {
    expect(isoinfoList(path, '-R')).toEqual(expected(seedFiles));
    expect(isoinfoList(path, '-J').map(({ name, size }) => ({ name, size }))).toEqual(
      expected(seedFiles).map(({ name, size }) => ({ name, size })),
    );
  });

  it('falls back to unique 8.3 names for readers without either extension', () => {
    expect(isoinfoList(path, null).map((r) => r.name)).toEqual([
      'EMPTY.;1',
      'META_DAT.;1',
      'NETWORK_.;1',
      'USER_DAT.;1',
      'VENDOR_D.;1',
    ]);
  });

  it('extracts byte-identical content through Rock Ridge and through Joliet', () => {
    for (const f of seedFiles) {
      const want = bytesOf(f.data);
      expect(runBytes('isoinfo', ['-R', '-x', `/${f.name}`, '-i', path]).equals(want), `-R ${f.name}`).toBe(
        true,
      );
      expect(runBytes('isoinfo', ['-J', '-x', `/${f.name}`, '-i', path]).equals(want), `-J ${f.name}`).toBe(
        true,
      );
    }
  });

  it('agrees with xorriso (libisofs) on names, sizes and content', () => {
    // libisofs only reads Rock Ridge (the r--r--r-- modes) after finding the RRIP_1991A ER entry,
    // which sits in a continuation area; without it, it falls back to Joliet's r-xr-xr-x.
    expect(xorrisoList(path, 'any')).toEqual(expected(seedFiles));
    expect(xorrisoList(path, 'norock').map((r) => [r.name, r.size])).toEqual(
      expected(seedFiles).map((r) => [r.name, r.size]),
    );
    const out = join(dir, 'xorriso-extract');
    execFileSync('xorriso', ['-osirrox', 'on', '-indev', path, '-extract', '/', out], { stdio: 'ignore' });
    expect(readdirSync(out).sort()).toEqual(seedFiles.map((f) => f.name).sort());
    for (const f of seedFiles)
      expect(readFileSync(join(out, f.name)).equals(bytesOf(f.data)), f.name).toBe(true);
  });

  it('presents the same file list as genisoimage -J -r for the same files', () => {
    const src = join(dir, 'genisoimage-src');
    mkdirSync(src);
    for (const f of seedFiles) writeFileSync(join(src, f.name), bytesOf(f.data));
    const ref = join(dir, 'genisoimage.iso');
    execFileSync(
      'genisoimage',
      ['-quiet', '-o', ref, '-V', 'cidata', '-J', '-r', ...seedFiles.map((f) => f.name)],
      {
        cwd: src,
      },
    );
    for (const ext of ['-R', '-J', null] as const)
      expect(isoinfoList(path, ext)).toEqual(isoinfoList(ref, ext));
    const features = (p: string) =>
      run('isoinfo', ['-d', '-i', p])
        .split('\n')
        .filter((l) => /^(Volume id|Logical block size|Joliet|Rock Ridge)/.test(l));
    expect(features(path)).toEqual(features(ref));
  });

  it('writes consistent both-endian fields and the timestamp into the volume descriptors', () => {
    const when = new Date('2031-07-04T12:34:56.780Z');
    const img = buildIso({ volumeId: 'cidata', files: seedFiles, timestamp: when });
    for (const [sector, type] of [
      [16, 1],
      [17, 2],
    ] as const) {
      const d = img.subarray(sector * SECTOR_SIZE, (sector + 1) * SECTOR_SIZE);
      expect(d[0]).toBe(type);
      expect(d.toString('ascii', 1, 6)).toBe('CD001');
      expect(d.readUInt32LE(80)).toBe(img.length / SECTOR_SIZE);
      expect(d.readUInt32BE(84)).toBe(img.length / SECTOR_SIZE);
      expect(d.readUInt16LE(128)).toBe(2048);
      expect(d.readUInt16BE(130)).toBe(2048);
      expect(d.readUInt32LE(132)).toBe(d.readUInt32BE(136));
      // L and M path tables name the same root extent as the descriptor's root record.
      const rootExtent = d.readUInt32LE(156 + 2);
      expect(d.readUInt32BE(156 + 6)).toBe(rootExtent);
      expect(img.readUInt32LE(d.readUInt32LE(140) * SECTOR_SIZE + 2)).toBe(rootExtent);
      expect(img.readUInt32BE(d.readUInt32BE(148) * SECTOR_SIZE + 2)).toBe(rootExtent);
      expect(d.toString('ascii', 813, 829)).toBe('2031070412345678');
      expect(d.toString('ascii', 830, 846)).toBe('2031070412345678');
    }
    expect(img.subarray(17 * SECTOR_SIZE + 88, 17 * SECTOR_SIZE + 91).toString('ascii')).toBe('%/E');
    expect(img[18 * SECTOR_SIZE]).toBe(255);
    expect(img.subarray(0, 16 * SECTOR_SIZE).every((b) => b === 0)).toBe(true);
    const written = writeIso(img);
    const listing = run('isoinfo', ['-R', '-l', '-i', written]);
    const pvd = execFileSync('xorriso', ['-indev', written, '-pvd_info'], {
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    expect(pvd).toMatch(/^Creation Time: 2031070412345678$/m);
    expect(pvd).toMatch(/^Volume Id {4}: cidata$/m);
    expect(listing).toMatch(/-r--r--r-- .* Jul {2}4 2031 .* user-data/);
  });
});

describe('buildIso edge cases', () => {
  it('keeps many files readable when the directories span several sectors', () => {
    const files: IsoFile[] = Array.from({ length: 60 }, (_, i) => ({
      name: `file-with-a-fairly-long-name-number-${String(i).padStart(3, '0')}.yaml`,
      data: `content ${i}\n`,
    }));
    const path = writeIso(buildIso({ volumeId: 'many', files }));
    expect(isoinfoList(path, '-R')).toEqual(expected(files));
    expect(isoinfoList(path, '-J').map((r) => r.name)).toEqual(expected(files).map((r) => r.name));
    expect(new Set(isoinfoList(path, null).map((r) => r.name)).size).toBe(60);
    expect(runBytes('isoinfo', ['-R', '-x', `/${files[59]!.name}`, '-i', path]).toString()).toBe(
      'content 59\n',
    );
    expect(runBytes('isoinfo', ['-J', '-x', `/${files[0]!.name}`, '-i', path]).toString()).toBe(
      'content 0\n',
    );
  });

  it('round-trips 64-character non-ASCII names and colliding 8.3 names', () => {
    const long = `ñ${'é'.repeat(62)}z`;
    // 192 UTF-8 bytes: the Rock Ridge entries overflow the record into a continuation area.
    const cjk = '中'.repeat(64);
    const files: IsoFile[] = [
      { name: long, data: 'long' },
      { name: cjk, data: 'cjk' },
      { name: 'user-data', data: 'a' },
      { name: 'user-data2', data: 'bb' },
      { name: 'User Data', data: 'ccc' },
    ];
    const path = writeIso(buildIso({ volumeId: 'cidata', files }));
    expect(xorrisoList(path, 'any')).toEqual(expected(files));
    expect(xorrisoList(path, 'norock').map((r) => [r.name, r.size])).toEqual(
      expected(files).map((r) => [r.name, r.size]),
    );
    expect(runBytes('isoinfo', ['-R', '-x', '/user-data2', '-i', path]).toString()).toBe('bb');
    expect(runBytes('isoinfo', ['-R', '-x', '/User Data', '-i', path]).toString()).toBe('ccc');
    expect(new Set(isoinfoList(path, null).map((r) => r.name)).size).toBe(5);
  });

  it('writes a valid image with no files', () => {
    const path = writeIso(buildIso({ volumeId: 'cidata', files: [] }));
    expect(run('isoinfo', ['-d', '-i', path])).toContain('Rock Ridge signatures version 1 found');
    expect(isoinfoList(path, '-R')).toEqual([]);
  });

  it('is deterministic and independent of input order', () => {
    const a = buildIso({ volumeId: 'cidata', files: seedFiles });
    const b = buildIso({ volumeId: 'cidata', files: [...seedFiles].reverse() });
    expect(a.equals(buildIso({ volumeId: 'cidata', files: seedFiles }))).toBe(true);
    expect(a.equals(b)).toBe(true);
    const later = buildIso({
      volumeId: 'cidata',
      files: seedFiles,
      timestamp: new Date('2030-01-01T00:00:00Z'),
    });
    expect(later.equals(a)).toBe(false);
    expect(later.length).toBe(a.length);
  });
});

describe('buildIso input validation', () => {
  const bad =
    (files: IsoFile[], volumeId = 'cidata') =>
    () =>
      buildIso({ volumeId, files });
  const cases: Array<[string, () => Buffer, string, RegExp]> = [
    ['slash', bad([{ name: 'a/b', data: '' }]), 'files[0].name', /contains "\/"/],
    [
      'too long',
      bad([{ name: 'x'.repeat(65), data: '' }]),
      'files[0].name',
      /65 characters, the limit is 64/,
    ],
    [
      'duplicate',
      bad([
        { name: 'meta-data', data: '' },
        { name: 'user-data', data: '' },
        { name: 'meta-data', data: 'x' },
      ]),
      'files[2].name',
      /duplicates files\[0\]\.name/,
    ],
    ['empty', bad([{ name: '', data: '' }]), 'files[0].name', /must not be empty/],
    ['dot', bad([{ name: '..', data: '' }]), 'files[0].name', /reserved/],
    ['control', bad([{ name: 'a\nb', data: '' }]), 'files[0].name', /control character/],
    ['joliet-forbidden', bad([{ name: 'a:b', data: '' }]), 'files[0].name', /contains ":"/],
    ['non-BMP', bad([{ name: 'smile-😀', data: '' }]), 'files[0].name', /outside UCS-2/],
    ['volume id length', bad([], 'x'.repeat(33)), 'volumeId', /1 to 32 characters/],
    ['volume id chars', bad([], 'ci data'), 'volumeId', /may only use/],
  ];
  for (const [label, fn, field, message] of cases) {
    it(`rejects ${label} with an error naming ${field}`, () => {
      let err: unknown;
      try {
        fn();
      } catch (e) {
        err = e;
      }
      expect(err).toBeInstanceOf(IsoInputError);
      expect((err as IsoInputError).field).toBe(field);
      expect((err as IsoInputError).message).toMatch(message);
      expect((err as IsoInputError).message.startsWith(`${field}: `)).toBe(true);
      expect(classify(err)).toBe('Permanent');
    });
  }

  it('accepts names exactly at the 64-character limit', () => {
    const name = 'n'.repeat(64);
    const path = writeIso(buildIso({ volumeId: 'cidata', files: [{ name, data: 'ok' }] }));
    expect(isoinfoList(path, '-J').map((r) => r.name)).toEqual([name]);
    expect(isoinfoList(path, '-R').map((r) => r.name)).toEqual([name]);
  });
});
