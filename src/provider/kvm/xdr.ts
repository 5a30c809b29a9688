/**
 * provider/kvm/xdr — XDR (RFC 4506) encoding and decoding of the primitive types libvirt's RPC
 * protocol is built from: 4-byte big-endian words, 8-byte hypers, padded strings and opaques,
 * optional values (a bool word, then the value) and counted arrays.
 */

/** Malformed or out-of-range XDR data; the message names what was being read or written. */
export class XdrError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'XdrError';
  }
}

const INT_MIN = -0x8000_0000;
const INT_MAX = 0x7fff_ffff;
const UINT_MAX = 0xffff_ffff;
const HYPER_MIN = -(1n << 63n);
const HYPER_MAX = (1n << 63n) - 1n;
const UHYPER_MAX = (1n << 64n) - 1n;

const pad4 = (n: number): number => (4 - (n % 4)) % 4;

export class XdrWriter {
  private buf: Buffer;
  private len = 0;

  constructor(initialSize = 256) {
    this.buf = Buffer.alloc(initialSize);
  }

  private reserve(n: number): void {
    if (this.len + n <= this.buf.length) return;
    let size = this.buf.length * 2;
    while (size < this.len + n) size *= 2;
    const next = Buffer.alloc(size);
    this.buf.copy(next, 0, 0, this.len);
    this.buf = next;
  }

  int(v: number): this {
    if (!Number.isInteger(v) || v < INT_MIN || v > INT_MAX) throw new XdrError(`int out of range: ${v}`);
    this.reserve(4);
    this.buf.writeInt32BE(v, this.len);
    this.len += 4;
    return this;
  }

  uint(v: number): this {
    if (!Number.isInteger(v) || v < 0 || v > UINT_MAX) throw new XdrError(`unsigned int out of range: ${v}`);
    this.reserve(4);
    this.buf.writeUInt32BE(v, this.len);
    this.len += 4;
    return this;
  }

  hyper(v: bigint | number): this {
    const b = BigInt(v);
    if (b < HYPER_MIN || b > HYPER_MAX) throw new XdrError(`hyper out of range: ${b}`);
    this.reserve(8);
    this.buf.writeBigInt64BE(b, this.len);
    this.len += 8;
    return this;
  }

  uhyper(v: bigint | number): this {
    const b = BigInt(v);
    if (b < 0n || b > UHYPER_MAX) throw new XdrError(`unsigned hyper out of range: ${b}`);
    this.reserve(8);
    this.buf.writeBigUInt64BE(b, this.len);
    this.len += 8;
    return this;
  }

  bool(v: boolean): this {
    return this.int(v ? 1 : 0);
  }

  /** Fixed-length opaque: exactly `length` bytes, then zero padding to a word boundary. */
  fixedOpaque(data: Uint8Array, length = data.length): this {
    if (data.length !== length) throw new XdrError(`fixed opaque needs ${length} bytes, got ${data.length}`);
    const p = pad4(length);
    this.reserve(length + p);
    this.buf.set(data, this.len);
    this.buf.fill(0, this.len + length, this.len + length + p);
    this.len += length + p;
    return this;
  }

  /** Variable-length opaque: a length word, the bytes, zero padding. */
  opaque(data: Uint8Array, max = UINT_MAX): this {
    if (data.length > max) throw new XdrError(`opaque longer than ${max} bytes: ${data.length}`);
    this.uint(data.length);
    return this.fixedOpaque(data);
  }

  string(s: string, max = UINT_MAX): this {
    const bytes = Buffer.from(s, 'utf8');
    if (bytes.length > max) throw new XdrError(`string longer than ${max} bytes: ${bytes.length}`);
    return this.opaque(bytes);
  }

  /** `T *x` in XDR: a bool word saying whether the value follows. */
  optional<T>(v: T | null | undefined, write: (w: this, v: T) => void): this {
    if (v === null || v === undefined) return this.bool(false);
    this.bool(true);
    write(this, v);
    return this;
  }

  array<T>(items: readonly T[], write: (w: this, v: T) => void, max = UINT_MAX): this {
    if (items.length > max) throw new XdrError(`array longer than ${max} items: ${items.length}`);
    this.uint(items.length);
    for (const item of items) write(this, item);
    return this;
  }

  get length(): number {
    return this.len;
  }

  /** The encoded bytes (a copy, so the writer may be reused). */
  bytes(): Buffer {
    return Buffer.from(this.buf.subarray(0, this.len));
  }
}

export class XdrReader {
  private readonly buf: Buffer;
  private pos = 0;

  constructor(buf: Uint8Array) {
    this.buf = Buffer.isBuffer(buf) ? buf : Buffer.from(buf.buffer, buf.byteOffset, buf.byteLength);
  }

  private need(n: number, what: string): void {
    if (this.pos + n > this.buf.length) {
      throw new XdrError(
        `truncated XDR reading ${what}: need ${n} bytes at offset ${this.pos}, have ${this.remaining}`,
      );
    }
  }

  get remaining(): number {
    return this.buf.length - this.pos;
  }

  get offset(): number {
    return this.pos;
  }

  int(): number {
    this.need(4, 'int');
    const v = this.buf.readInt32BE(this.pos);
    this.pos += 4;
    return v;
  }

  uint(): number {
    this.need(4, 'unsigned int');
    const v = this.buf.readUInt32BE(this.pos);
    this.pos += 4;
    return v;
  }

  hyper(): bigint {
    this.need(8, 'hyper');
    const v = this.buf.readBigInt64BE(this.pos);
    this.pos += 8;
    return v;
  }

  uhyper(): bigint {
    this.need(8, 'unsigned hyper');
    const v = this.buf.readBigUInt64BE(this.pos);
    this.pos += 8;
    return v;
  }

  bool(): boolean {
    const v = this.int();
    if (v !== 0 && v !== 1) throw new XdrError(`bool must be 0 or 1, got ${v}`);
    return v === 1;
  }

  fixedOpaque(length: number): Buffer {
    const p = pad4(length);
    this.need(length + p, `opaque[${length}]`);
    const out = Buffer.from(this.buf.subarray(this.pos, this.pos + length));
    this.pos += length + p;
    return out;
  }

  opaque(max = UINT_MAX): Buffer {
    const n = this.uint();
    if (n > max) throw new XdrError(`opaque length ${n} exceeds limit ${max}`);
    return this.fixedOpaque(n);
  }

  string(max = UINT_MAX): string {
    const n = this.uint();
    if (n > max) throw new XdrError(`string length ${n} exceeds limit ${max}`);
    return this.fixedOpaque(n).toString('utf8');
  }

  optional<T>(read: (r: this) => T): T | null {
    return this.bool() ? read(this) : null;
  }

  array<T>(read: (r: this) => T, max = UINT_MAX): T[] {
    const n = this.uint();
    if (n > max) throw new XdrError(`array length ${n} exceeds limit ${max}`);
    // Every element takes at least one word: a count larger than the data left is corrupt,
    // and checking it here avoids a huge allocation loop on garbage.
    if (n > this.remaining / 4 + 1) throw new XdrError(`array length ${n} larger than the remaining data`);
    const out: T[] = [];
    for (let i = 0; i < n; i++) out.push(read(this));
    return out;
  }

  /** Throws unless every byte was consumed (a reply with trailing bytes means a wrong struct). */
  end(): void {
    if (this.remaining !== 0) throw new XdrError(`${this.remaining} unexpected trailing bytes`);
  }
}
