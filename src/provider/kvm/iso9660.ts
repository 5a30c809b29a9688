/**
 * provider/kvm/iso9660 — writes a small, flat ISO 9660 image in memory, with Rock Ridge and
 * Joliet names, so a cloud-init NoCloud seed keeps names such as `user-data` under either
 * extension (plain level-1 names would read back as `USER_DAT.;1`).
 */

import { Buffer } from 'node:buffer';
import { ProviderError } from '../errors.ts';

export const SECTOR_SIZE = 2048;
/** Joliet's limit (UCS-2 code units); Rock Ridge and the level-1 name are derived from the same name. */
export const ISO_MAX_NAME_LENGTH = 64;
export const ISO_MAX_VOLUME_ID_LENGTH = 32;
/** Used when no timestamp is supplied, so the same input always yields the same bytes. */
export const DEFAULT_ISO_TIMESTAMP = new Date('2000-01-01T00:00:00Z');
const MAX_FILE_SIZE = 0xffff_ffff;

export interface IsoFile {
  /** The name under Rock Ridge and Joliet; a level-1 8.3 name is derived for plain readers. */
  name: string;
  /** A string is written as UTF-8. */
  data: Uint8Array | string;
}

export interface BuildIsoOptions {
  /** Primary volume identifier (the filesystem label, e.g. `cidata`); Joliet keeps its first 16 characters. */
  volumeId: string;
  /** Files of the root directory; the image is flat. */
  files: readonly IsoFile[];
  /** Every date in the image; defaults to DEFAULT_ISO_TIMESTAMP. */
  timestamp?: Date;
}

/** Bad input to buildIso: names the offending field. Permanent, since retrying cannot fix it. */
export class IsoInputError extends ProviderError {
  readonly field: string;
  constructor(field: string, message: string) {
    super('Permanent', `${field}: ${message}`, { op: 'buildIso', provider: 'kvm' });
    this.name = 'IsoInputError';
    this.field = field;
  }
}

// Joliet forbids these besides control characters; '/' would also break the path for every reader.
const FORBIDDEN_NAME_CHARS = new Set(['/', '\\', '*', ':', ';', '?']);
const VOLUME_ID_RE = /^[A-Za-z0-9_.-]+$/;

export function validateIsoName(name: unknown, field = 'name'): string {
  if (typeof name !== 'string') throw new IsoInputError(field, 'must be a string');
  if (name.length === 0) throw new IsoInputError(field, 'must not be empty');
  if (name.length > ISO_MAX_NAME_LENGTH) {
    throw new IsoInputError(
      field,
      `${JSON.stringify(name.slice(0, 16))}… is ${name.length} characters, the limit is ${ISO_MAX_NAME_LENGTH}`,
    );
  }
  if (name === '.' || name === '..') throw new IsoInputError(field, `${JSON.stringify(name)} is reserved`);
  for (const ch of name) {
    const code = ch.codePointAt(0)!;
    if (FORBIDDEN_NAME_CHARS.has(ch)) {
      throw new IsoInputError(field, `${JSON.stringify(name)} contains ${JSON.stringify(ch)}`);
    }
    if (code < 0x20 || code === 0x7f) {
      throw new IsoInputError(field, `${JSON.stringify(name)} contains a control character`);
    }
    if (code > 0xffff || (code >= 0xd800 && code <= 0xdfff)) {
      throw new IsoInputError(
        field,
        `${JSON.stringify(name)} has a character outside UCS-2, which Joliet cannot store`,
      );
    }
  }
  return name;
}

function validateVolumeId(volumeId: unknown): string {
  if (typeof volumeId !== 'string') throw new IsoInputError('volumeId', 'must be a string');
  if (volumeId.length === 0 || volumeId.length > ISO_MAX_VOLUME_ID_LENGTH) {
    throw new IsoInputError('volumeId', `must be 1 to ${ISO_MAX_VOLUME_ID_LENGTH} characters`);
  }
  if (!VOLUME_ID_RE.test(volumeId)) {
    throw new IsoInputError('volumeId', `${JSON.stringify(volumeId)} may only use A-Z a-z 0-9 _ . -`);
  }
  return volumeId;
}

// ---- byte helpers -------------------------------------------------------------------------------

function both16(buf: Buffer, off: number, v: number): void {
  buf.writeUInt16LE(v, off);
  buf.writeUInt16BE(v, off + 2);
}

function both32(buf: Buffer, off: number, v: number): void {
  buf.writeUInt32LE(v, off);
  buf.writeUInt32BE(v, off + 4);
}

/** 7-byte directory-record date (ECMA-119 9.1.5), always UTC. */
function recordDate(d: Date): Buffer {
  return Buffer.from([
    d.getUTCFullYear() - 1900,
    d.getUTCMonth() + 1,
    d.getUTCDate(),
    d.getUTCHours(),
    d.getUTCMinutes(),
    d.getUTCSeconds(),
    0,
  ]);
}

/** 17-byte volume-descriptor date (ECMA-119 8.4.26.1); `null` is the "not specified" form. */
function volumeDate(d: Date | null): Buffer {
  const out = Buffer.alloc(17, 0);
  if (d === null) {
    out.write('0000000000000000', 0, 'ascii');
    return out;
  }
  const p = (n: number, w: number) => String(n).padStart(w, '0');
  const text =
    p(d.getUTCFullYear(), 4) +
    p(d.getUTCMonth() + 1, 2) +
    p(d.getUTCDate(), 2) +
    p(d.getUTCHours(), 2) +
    p(d.getUTCMinutes(), 2) +
    p(d.getUTCSeconds(), 2) +
    p(Math.floor(d.getUTCMilliseconds() / 10), 2);
  out.write(text, 0, 'ascii');
  return out;
}

function ucs2be(s: string): Buffer {
  const out = Buffer.alloc(s.length * 2);
  for (let i = 0; i < s.length; i++) out.writeUInt16BE(s.charCodeAt(i), i * 2);
  return out;
}

function padSector(len: number): number {
  return Math.ceil(len / SECTOR_SIZE);
}

// ---- level-1 names ------------------------------------------------------------------------------

interface Level1Name {
  base: string;
  ext: string;
}

function level1Chars(s: string): string {
  return s.toUpperCase().replace(/[^A-Z0-9_]/g, '_');
}

/** 8.3 names for plain ISO 9660 readers, made unique with a numeric suffix when they collide. */
function level1Names(names: readonly string[]): Level1Name[] {
  const taken = new Set<string>();
  return names.map((name) => {
    const dot = name.lastIndexOf('.');
    const hasExt = dot > 0 && dot < name.length - 1;
    let base = level1Chars(hasExt ? name.slice(0, dot) : name).slice(0, 8);
    const ext = hasExt ? level1Chars(name.slice(dot + 1)).slice(0, 3) : '';
    if (base === '') base = '_';
    let candidate = base;
    for (let n = 1; taken.has(`${candidate}.${ext}`); n++) {
      const suffix = String(n);
      candidate = base.slice(0, 8 - suffix.length) + suffix;
    }
    taken.add(`${candidate}.${ext}`);
    return { base: candidate, ext };
  });
}

function compareLevel1(a: Level1Name, b: Level1Name): number {
  // ECMA-119 9.3: names padded with spaces compare first, then extensions.
  const an = a.base.padEnd(8, ' ');
  const bn = b.base.padEnd(8, ' ');
  if (an !== bn) return an < bn ? -1 : 1;
  const ae = a.ext.padEnd(3, ' ');
  const be = b.ext.padEnd(3, ' ');
  return ae < be ? -1 : ae > be ? 1 : 0;
}

// ---- SUSP / Rock Ridge entries ------------------------------------------------------------------

const S_IFDIR = 0o040000;
const S_IFREG = 0o100000;
const CE_LENGTH = 28;
// Record length is one byte and must be even.
const MAX_RECORD = 254;

function suspEntry(sig: string, payload: Buffer): Buffer {
  const head = Buffer.from([sig.charCodeAt(0), sig.charCodeAt(1), 4 + payload.length, 1]);
  return Buffer.concat([head, payload]);
}

function spEntry(): Buffer {
  return suspEntry('SP', Buffer.from([0xbe, 0xef, 0]));
}

const RR_PX = 0x01;
const RR_NM = 0x08;
const RR_TF = 0x80;

/** RRIP 1.09 "RR" flags entry; Linux consults it before looking for NM. */
function rrEntry(flags: number): Buffer {
  return suspEntry('RR', Buffer.from([flags]));
}

function pxEntry(mode: number, nlink: number): Buffer {
  const p = Buffer.alloc(32);
  both32(p, 0, mode);
  both32(p, 8, nlink);
  both32(p, 16, 0);
  both32(p, 24, 0);
  return suspEntry('PX', p);
}

function tfEntry(date: Date): Buffer {
  // modify, access and attribute-change times, short form.
  const d = recordDate(date);
  return suspEntry('TF', Buffer.concat([Buffer.from([0x02 | 0x04 | 0x08]), d, d, d]));
}

/** NM entries; long UTF-8 names are split with the CONTINUE flag so each entry stays small. */
function nmEntries(name: string): Buffer[] {
  const bytes = Buffer.from(name, 'utf8');
  const chunk = 100;
  const out: Buffer[] = [];
  for (let i = 0; i < bytes.length; i += chunk) {
    const last = i + chunk >= bytes.length;
    out.push(suspEntry('NM', Buffer.concat([Buffer.from([last ? 0 : 0x01]), bytes.subarray(i, i + chunk)])));
  }
  return out;
}

const RRIP_ID = 'RRIP_1991A';
const RRIP_DESCRIPTOR =
  'THE ROCK RIDGE INTERCHANGE PROTOCOL PROVIDES SUPPORT FOR POSIX FILE SYSTEM SEMANTICS';
const RRIP_SOURCE =
  'PLEASE CONTACT DISC PUBLISHER FOR SPECIFICATION SOURCE.  SEE PUBLISHER IDENTIFIER IN PRIMARY VOLUME DESCRIPTOR FOR CONTACT INFORMATION.';

function erEntry(): Buffer {
  const head = Buffer.from([RRIP_ID.length, RRIP_DESCRIPTOR.length, RRIP_SOURCE.length, 1]);
  return suspEntry(
    'ER',
    Buffer.concat([head, Buffer.from(RRIP_ID + RRIP_DESCRIPTOR + RRIP_SOURCE, 'ascii')]),
  );
}

// ---- directory records --------------------------------------------------------------------------

interface PlannedRecord {
  bytes: Buffer;
  /** Offset of the CE entry inside `bytes`, and the continuation area it points at. */
  ce?: { offset: number; area: number };
}

interface ContinuationArea {
  data: Buffer;
  sector: number;
  offset: number;
}

interface RecordSpec {
  id: Buffer;
  extent: number;
  size: number;
  directory: boolean;
  date: Date;
  su: Buffer[];
}

/**
 * Builds one directory record. System-use entries that do not fit the 255-byte record go to a
 * continuation area (SUSP CE), which is how the long ER entry of the root's "." travels.
 */
function planRecord(spec: RecordSpec, areas: ContinuationArea[]): PlannedRecord {
  const idPad = spec.id.length % 2 === 0 ? 1 : 0;
  const base = 33 + spec.id.length + idPad;
  const room = MAX_RECORD - base;
  const total = spec.su.reduce((n, e) => n + e.length, 0);
  let inline = spec.su;
  let overflow: Buffer[] = [];
  if (total > room) {
    let used = 0;
    let i = 0;
    while (i < spec.su.length && used + spec.su[i]!.length + CE_LENGTH <= room) used += spec.su[i++]!.length;
    inline = spec.su.slice(0, i);
    overflow = spec.su.slice(i);
  }
  const ceOffset = base + inline.reduce((n, e) => n + e.length, 0);
  const parts = [...inline];
  let ce: PlannedRecord['ce'];
  if (overflow.length > 0) {
    areas.push({ data: Buffer.concat(overflow), sector: 0, offset: 0 });
    ce = { offset: ceOffset, area: areas.length - 1 };
    parts.push(Buffer.alloc(CE_LENGTH));
  }
  const suBytes = Buffer.concat(parts);
  const length = base + suBytes.length + ((base + suBytes.length) % 2);
  const rec = Buffer.alloc(length, 0);
  rec[0] = length;
  rec[1] = 0;
  both32(rec, 2, spec.extent);
  both32(rec, 10, spec.size);
  recordDate(spec.date).copy(rec, 18);
  rec[25] = spec.directory ? 0x02 : 0x00;
  rec[26] = 0;
  rec[27] = 0;
  both16(rec, 28, 1);
  rec[32] = spec.id.length;
  spec.id.copy(rec, 33);
  suBytes.copy(rec, base);
  return ce === undefined ? { bytes: rec } : { bytes: rec, ce };
}

/** Lays records into sectors; a record never crosses a sector boundary. */
function directoryBytes(records: readonly PlannedRecord[]): { data: Buffer; offsets: number[] } {
  const chunks: Buffer[] = [];
  const offsets: number[] = [];
  let pos = 0;
  for (const r of records) {
    const left = SECTOR_SIZE - (pos % SECTOR_SIZE);
    if (r.bytes.length > left) {
      chunks.push(Buffer.alloc(left));
      pos += left;
    }
    offsets.push(pos);
    chunks.push(r.bytes);
    pos += r.bytes.length;
  }
  const data = Buffer.concat(chunks);
  const padded = Buffer.alloc(Math.max(1, padSector(data.length)) * SECTOR_SIZE);
  data.copy(padded);
  return { data: padded, offsets };
}

function pathTable(rootExtent: number, bigEndian: boolean): Buffer {
  const t = Buffer.alloc(10, 0);
  t[0] = 1; // identifier length: the root's single 0x00
  t[1] = 0;
  if (bigEndian) {
    t.writeUInt32BE(rootExtent, 2);
    t.writeUInt16BE(1, 6);
  } else {
    t.writeUInt32LE(rootExtent, 2);
    t.writeUInt16LE(1, 6);
  }
  return t;
}

// ---- volume descriptors -------------------------------------------------------------------------

interface DescriptorFields {
  type: 1 | 2;
  volumeId: string;
  volumeSectors: number;
  pathTableSize: number;
  lPath: number;
  mPath: number;
  root: Buffer;
  date: Date;
}

const SYSTEM_ID = 'LINUX';
const APPLICATION_ID = 'EGRESS-PROXIES-OPERATOR';

function volumeDescriptor(f: DescriptorFields): Buffer {
  const d = Buffer.alloc(SECTOR_SIZE, 0);
  const joliet = f.type === 2;
  // a/d-character fields are space-padded; Joliet's are UCS-2 (big-endian) space-padded.
  const text = (off: number, len: number, s: string) => {
    if (joliet) {
      for (let i = 0; i < len; i += 2) d.writeUInt16BE(0x0020, off + i);
      ucs2be(s.slice(0, len / 2)).copy(d, off);
    } else {
      d.fill(0x20, off, off + len);
      d.write(s.slice(0, len), off, 'ascii');
    }
  };
  d[0] = f.type;
  d.write('CD001', 1, 'ascii');
  d[6] = 1;
  text(8, 32, SYSTEM_ID);
  text(40, 32, f.volumeId);
  both32(d, 80, f.volumeSectors);
  if (joliet) d.write('%/E', 88, 'ascii'); // UCS-2 level 3
  both16(d, 120, 1);
  both16(d, 124, 1);
  both16(d, 128, SECTOR_SIZE);
  both32(d, 132, f.pathTableSize);
  d.writeUInt32LE(f.lPath, 140);
  d.writeUInt32BE(f.mPath, 148);
  f.root.copy(d, 156);
  text(190, 128, '');
  text(318, 128, '');
  text(446, 128, '');
  text(574, 128, APPLICATION_ID);
  text(702, 37, '');
  text(739, 37, '');
  text(776, 37, '');
  volumeDate(f.date).copy(d, 813);
  volumeDate(f.date).copy(d, 830);
  volumeDate(null).copy(d, 847);
  volumeDate(null).copy(d, 864);
  d[881] = 1;
  return d;
}

function terminator(): Buffer {
  const d = Buffer.alloc(SECTOR_SIZE, 0);
  d[0] = 255;
  d.write('CD001', 1, 'ascii');
  d[6] = 1;
  return d;
}

// ---- the image ----------------------------------------------------------------------------------

interface Entry {
  name: string;
  data: Buffer;
  level1: Level1Name;
  extent: number;
}

/**
 * Builds the image: system area, primary + Joliet descriptors, terminator, path tables, the
 * primary root (Rock Ridge) and the Joliet root, continuation areas, then one extent per file.
 * The result depends only on the file set and the timestamp, not on the order of `files`.
 */
export function buildIso(options: BuildIsoOptions): Buffer {
  const volumeId = validateVolumeId(options.volumeId);
  const date = options.timestamp ?? DEFAULT_ISO_TIMESTAMP;
  if (!(date instanceof Date) || Number.isNaN(date.getTime())) {
    throw new IsoInputError('timestamp', 'must be a valid Date');
  }
  if (date.getUTCFullYear() < 1900 || date.getUTCFullYear() > 2155) {
    throw new IsoInputError('timestamp', 'year must be between 1900 and 2155');
  }
  if (!Array.isArray(options.files)) throw new IsoInputError('files', 'must be an array');

  const seen = new Map<string, number>();
  const inputs = options.files.map((f, i) => {
    const name = validateIsoName(f?.name, `files[${i}].name`);
    const prior = seen.get(name);
    if (prior !== undefined) {
      throw new IsoInputError(`files[${i}].name`, `${JSON.stringify(name)} duplicates files[${prior}].name`);
    }
    seen.set(name, i);
    let data: Buffer;
    if (typeof f.data === 'string') data = Buffer.from(f.data, 'utf8');
    else if (f.data instanceof Uint8Array)
      data = Buffer.from(f.data.buffer, f.data.byteOffset, f.data.byteLength);
    else throw new IsoInputError(`files[${i}].data`, 'must be a string or a Buffer');
    if (data.length > MAX_FILE_SIZE) throw new IsoInputError(`files[${i}].data`, 'is larger than 4 GiB - 1');
    return { name, data };
  });

  const names = level1Names(inputs.map((f) => f.name));
  const entries: Entry[] = inputs.map((f, i) => ({ ...f, level1: names[i]!, extent: 0 }));
  const primaryOrder = [...entries].sort((a, b) => compareLevel1(a.level1, b.level1));
  const jolietOrder = [...entries].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));

  // Pass 1 sizes everything (record lengths do not depend on extents), pass 2 fills in extents.
  const layout = { primaryRoot: 0, primarySize: 0, jolietRoot: 0, jolietSize: 0, ceStart: 0 };
  const build = () => {
    const areas: ContinuationArea[] = [];
    const dirPx = pxEntry(S_IFDIR | 0o555, 2);
    const dirTf = tfEntry(date);
    const dot = planRecord(
      {
        id: Buffer.from([0]),
        extent: layout.primaryRoot,
        size: layout.primarySize,
        directory: true,
        date,
        su: [spEntry(), rrEntry(RR_PX | RR_TF), dirPx, dirTf, erEntry()],
      },
      areas,
    );
    const dotdot = planRecord(
      {
        id: Buffer.from([1]),
        extent: layout.primaryRoot,
        size: layout.primarySize,
        directory: true,
        date,
        su: [rrEntry(RR_PX | RR_TF), dirPx, dirTf],
      },
      areas,
    );
    const primary = [dot, dotdot];
    for (const e of primaryOrder) {
      primary.push(
        planRecord(
          {
            id: Buffer.from(`${e.level1.base}.${e.level1.ext};1`, 'ascii'),
            extent: e.extent,
            size: e.data.length,
            directory: false,
            date,
            su: [
              rrEntry(RR_PX | RR_TF | RR_NM),
              ...nmEntries(e.name),
              pxEntry(S_IFREG | 0o444, 1),
              tfEntry(date),
            ],
          },
          areas,
        ),
      );
    }
    const jolietRecords = [
      planRecord(
        {
          id: Buffer.from([0]),
          extent: layout.jolietRoot,
          size: layout.jolietSize,
          directory: true,
          date,
          su: [],
        },
        areas,
      ),
      planRecord(
        {
          id: Buffer.from([1]),
          extent: layout.jolietRoot,
          size: layout.jolietSize,
          directory: true,
          date,
          su: [],
        },
        areas,
      ),
      ...jolietOrder.map((e) =>
        planRecord(
          { id: ucs2be(e.name), extent: e.extent, size: e.data.length, directory: false, date, su: [] },
          areas,
        ),
      ),
    ];
    // Continuation areas are packed into whole sectors after the directories.
    let sector = 0;
    let offset = 0;
    for (const a of areas) {
      if (offset + a.data.length > SECTOR_SIZE) {
        sector++;
        offset = 0;
      }
      a.sector = sector;
      a.offset = offset;
      offset += a.data.length;
    }
    for (const r of primary) {
      if (r.ce === undefined) continue;
      const a = areas[r.ce.area]!;
      const ce = suspEntry('CE', Buffer.alloc(24));
      both32(ce, 4, layout.ceStart + a.sector);
      both32(ce, 12, a.offset);
      both32(ce, 20, a.data.length);
      ce.copy(r.bytes, r.ce.offset);
    }
    const ceSectors = areas.length === 0 ? 0 : sector + 1;
    return { primary: directoryBytes(primary), joliet: directoryBytes(jolietRecords), areas, ceSectors };
  };

  // Sectors 0-15 are the system area and stay zero.
  const PVD = 16;
  const SVD = 17;
  const TERM = 18;
  const L_PRIMARY = 19;
  const M_PRIMARY = 20;
  const L_JOLIET = 21;
  const M_JOLIET = 22;
  const FIRST_DIR = 23;

  const sized = build();
  layout.primaryRoot = FIRST_DIR;
  layout.primarySize = sized.primary.data.length;
  layout.jolietRoot = layout.primaryRoot + sized.primary.data.length / SECTOR_SIZE;
  layout.jolietSize = sized.joliet.data.length;
  layout.ceStart = layout.jolietRoot + sized.joliet.data.length / SECTOR_SIZE;
  let next = layout.ceStart + sized.ceSectors;
  const dataStart = next;
  for (const e of primaryOrder) {
    if (e.data.length === 0) continue;
    e.extent = next;
    next += padSector(e.data.length);
  }
  // A zero-length file still needs an extent inside the volume; it reads no sector of it.
  for (const e of primaryOrder) if (e.data.length === 0) e.extent = dataStart < next ? dataStart : FIRST_DIR;
  const totalSectors = next;

  const final = build();
  const image = Buffer.alloc(totalSectors * SECTOR_SIZE, 0);
  const at = (sector: number) => sector * SECTOR_SIZE;
  const root = (extent: number, size: number) =>
    planRecord({ id: Buffer.from([0]), extent, size, directory: true, date, su: [] }, []).bytes;
  volumeDescriptor({
    type: 1,
    volumeId,
    volumeSectors: totalSectors,
    pathTableSize: 10,
    lPath: L_PRIMARY,
    mPath: M_PRIMARY,
    root: root(layout.primaryRoot, layout.primarySize),
    date,
  }).copy(image, at(PVD));
  volumeDescriptor({
    type: 2,
    volumeId: volumeId.slice(0, 16),
    volumeSectors: totalSectors,
    pathTableSize: 10,
    lPath: L_JOLIET,
    mPath: M_JOLIET,
    root: root(layout.jolietRoot, layout.jolietSize),
    date,
  }).copy(image, at(SVD));
  terminator().copy(image, at(TERM));
  pathTable(layout.primaryRoot, false).copy(image, at(L_PRIMARY));
  pathTable(layout.primaryRoot, true).copy(image, at(M_PRIMARY));
  pathTable(layout.jolietRoot, false).copy(image, at(L_JOLIET));
  pathTable(layout.jolietRoot, true).copy(image, at(M_JOLIET));
  final.primary.data.copy(image, at(layout.primaryRoot));
  final.joliet.data.copy(image, at(layout.jolietRoot));
  for (const a of final.areas) a.data.copy(image, at(layout.ceStart + a.sector) + a.offset);
  for (const e of primaryOrder) if (e.data.length > 0) e.data.copy(image, at(e.extent));
  return image;
}
