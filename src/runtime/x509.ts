/**
 * runtime/x509 — the one certificate writer: the gateway's inspection CA and the leaves it signs
 * (docs/gateway.md, "HTTPS inspection"), and the self-signed serving certificate of
 * `--metrics-secure` (metrics/selfsigned). Written as DER here and signed with node:crypto (P-256,
 * ECDSA with SHA-256): Node can sign but not build certificates, and the few structures needed
 * are small enough to write by hand, which keeps a dependency (and its reflection polyfill) out
 * of the process that holds the CA key. The certificates carry what strict verifiers ask for
 * (OpenSSL's X509_STRICT, Python's `ssl`, Chromium): a CA has basicConstraints CA:TRUE, keyUsage
 * keyCertSign/cRLSign and a subjectKeyIdentifier; a leaf has subjectAltName, extendedKeyUsage
 * serverAuth, basicConstraints CA:FALSE and, when a CA signs it, an authorityKeyIdentifier.
 */
import {
  createHash,
  generateKeyPairSync,
  type KeyObject,
  randomBytes,
  sign,
  type X509Certificate,
} from 'node:crypto';
import { isIPv4, isIPv6 } from 'node:net';

function der(tag: number, content: Buffer): Buffer {
  const n = content.length;
  let len: Buffer;
  if (n < 0x80) len = Buffer.from([n]);
  else {
    const bytes: number[] = [];
    for (let v = n; v > 0; v >>= 8) bytes.unshift(v & 0xff);
    len = Buffer.from([0x80 | bytes.length, ...bytes]);
  }
  return Buffer.concat([Buffer.from([tag]), len, content]);
}

const seq = (...items: Buffer[]) => der(0x30, Buffer.concat(items));
const set = (...items: Buffer[]) => der(0x31, Buffer.concat(items));
const octets = (b: Buffer) => der(0x04, b);
const bits = (b: Buffer, unused = 0) => der(0x03, Buffer.concat([Buffer.from([unused]), b]));
const explicit = (n: number, inner: Buffer) => der(0xa0 | n, inner);
const TRUE = der(0x01, Buffer.from([0xff]));

function oid(dotted: string): Buffer {
  const [a = 0, b = 0, ...rest] = dotted.split('.').map(Number);
  const out = [a * 40 + b];
  for (const v of rest) {
    const chunk = [v & 0x7f];
    for (let x = v >> 7; x > 0; x >>= 7) chunk.unshift(0x80 | (x & 0x7f));
    out.push(...chunk);
  }
  return der(0x06, Buffer.from(out));
}

/** A DER INTEGER of the unsigned big-endian `b`: minimal, so no leading zero byte a strict parser refuses. */
function integer(b: Buffer): Buffer {
  let start = 0;
  while (start < b.length - 1 && b[start] === 0) start++;
  const v = b.subarray(start);
  return der(0x02, (v[0] ?? 0) & 0x80 ? Buffer.concat([Buffer.from([0]), v]) : v);
}

/** UTCTime before 2050, GeneralizedTime from then on (RFC 5280 4.1.2.5). */
function time(d: Date): Buffer {
  const s = d.toISOString(); // 2025-01-02T03:04:05.678Z
  const digits = `${s.slice(5, 7)}${s.slice(8, 10)}${s.slice(11, 13)}${s.slice(14, 16)}${s.slice(17, 19)}Z`;
  const year = d.getUTCFullYear();
  return year < 2050
    ? der(0x17, Buffer.from(`${s.slice(2, 4)}${digits}`, 'ascii'))
    : der(0x18, Buffer.from(`${s.slice(0, 4)}${digits}`, 'ascii'));
}

/** A distinguished name of one common name. */
export const commonName = (cn: string): Buffer =>
  seq(set(seq(oid('2.5.4.3'), der(0x0c, Buffer.from(cn, 'utf8')))));

function extension(id: string, value: Buffer, critical = false): Buffer {
  return critical ? seq(oid(id), TRUE, octets(value)) : seq(oid(id), octets(value));
}

/** The key identifier of RFC 5280 4.2.1.2 (1): SHA-1 of the subjectPublicKey bits. */
function keyId(key: KeyObject): Buffer {
  const jwk = key.export({ format: 'jwk' });
  const point = Buffer.concat([
    Buffer.from([4]),
    Buffer.from(jwk.x ?? '', 'base64url'),
    Buffer.from(jwk.y ?? '', 'base64url'),
  ]);
  return createHash('sha1').update(point).digest();
}

/** The 16 bytes of an IPv6 address in text form. */
function ipv6Bytes(address: string): Buffer {
  const text = address.replace(/(\d+)\.(\d+)\.(\d+)\.(\d+)$/, (_m, a, b, c, d) => {
    const word = (x: string, y: string) => ((Number(x) << 8) | Number(y)).toString(16);
    return `${word(a, b)}:${word(c, d)}`;
  });
  const [head = '', rest] = text.split('::');
  const groups = (s: string) => (s === '' ? [] : s.split(':').map((g) => Number.parseInt(g, 16)));
  const left = groups(head);
  const right = rest === undefined ? [] : groups(rest);
  const zeros = Array.from({ length: Math.max(0, 8 - left.length - right.length) }, () => 0);
  const out = Buffer.alloc(16);
  const words = [...left, ...zeros, ...right].slice(0, 8);
  for (const [i, w] of words.entries()) out.writeUInt16BE(w & 0xffff, i * 2);
  return out;
}

/** A subjectAltName GeneralName: iPAddress for an address literal, dNSName otherwise. */
function altName(name: string): Buffer {
  if (isIPv4(name)) return der(0x87, Buffer.from(name.split('.').map(Number)));
  if (isIPv6(name)) return der(0x87, ipv6Bytes(name));
  return der(0x82, Buffer.from(name.toLowerCase(), 'ascii'));
}

const ECDSA_SHA256 = seq(oid('1.2.840.10045.4.3.2'));

function toPem(cert: Buffer): string {
  const b64 = cert.toString('base64').replace(/.{64}/g, '$&\n');
  return `-----BEGIN CERTIFICATE-----\n${b64}${b64.endsWith('\n') ? '' : '\n'}-----END CERTIFICATE-----\n`;
}

function certificate(o: {
  subject: Buffer;
  issuer: Buffer;
  publicKey: KeyObject;
  signingKey: KeyObject;
  notBefore: Date;
  notAfter: Date;
  extensions: Buffer[];
}): string {
  const serial = randomBytes(16);
  serial[0] = ((serial[0] ?? 0) & 0x7f) | 0x01;
  const tbs = seq(
    explicit(0, integer(Buffer.from([2]))),
    integer(serial),
    ECDSA_SHA256,
    o.issuer,
    seq(time(o.notBefore), time(o.notAfter)),
    o.subject,
    o.publicKey.export({ type: 'spki', format: 'der' }),
    explicit(3, seq(...o.extensions)),
  );
  return toPem(seq(tbs, ECDSA_SHA256, bits(sign('sha256', tbs, o.signingKey))));
}

/** A new P-256 key pair. */
export function newKeyPair(): { publicKey: KeyObject; privateKey: KeyObject } {
  return generateKeyPairSync('ec', { namedCurve: 'prime256v1' });
}

/** A self-signed CA certificate (PEM) for `keys`, named `cn`, valid from an hour before `now` for `days`. */
export function makeCaCertificate(
  cn: string,
  keys: { publicKey: KeyObject; privateKey: KeyObject },
  now: number,
  days: number,
): string {
  return selfSigned(cn, keys, now - 3_600_000, now + days * 86_400_000, [
    extension('2.5.29.19', seq(TRUE), true), // basicConstraints CA:TRUE
    extension('2.5.29.15', bits(Buffer.from([0x06]), 1), true), // keyUsage keyCertSign, cRLSign
    extension('2.5.29.14', octets(keyId(keys.publicKey))), // subjectKeyIdentifier
  ]);
}

function selfSigned(
  cn: string,
  keys: { publicKey: KeyObject; privateKey: KeyObject },
  notBefore: number,
  notAfter: number,
  extensions: Buffer[],
): string {
  return certificate({
    subject: commonName(cn),
    issuer: commonName(cn),
    publicKey: keys.publicKey,
    signingKey: keys.privateKey,
    notBefore: new Date(notBefore),
    notAfter: new Date(notAfter),
    extensions,
  });
}

/** Reads one DER element at `at`: where its content starts and where the element ends. */
function element(buf: Buffer, at: number): { content: number; end: number } {
  const first = buf[at + 1] ?? 0;
  if (first < 0x80) return { content: at + 2, end: at + 2 + first };
  const n = first & 0x7f;
  let len = 0;
  for (let i = 0; i < n; i++) len = len * 256 + (buf[at + 2 + i] ?? 0);
  return { content: at + 2 + n, end: at + 2 + n + len };
}

/** The subject name of a certificate, byte for byte (a leaf's issuer must equal it). */
export function subjectOf(cert: X509Certificate): Buffer {
  const raw = cert.raw;
  const tbs = element(raw, element(raw, 0).content);
  let at = tbs.content;
  // version [0], serialNumber, signature, issuer, validity, then subject.
  if (raw[at] === 0xa0) at = element(raw, at).end;
  for (let i = 0; i < 4; i++) at = element(raw, at).end;
  return raw.subarray(at, element(raw, at).end);
}

/**
 * A self-signed serving certificate (PEM) named `cn` for `names`, valid from `notBefore` to
 * `notAfter`: keyUsage digitalSignature, serverAuth, not a CA.
 */
export function selfSignedServer(
  cn: string,
  names: readonly string[],
  keys: { publicKey: KeyObject; privateKey: KeyObject },
  notBefore: number,
  notAfter: number,
): string {
  return selfSigned(cn, keys, notBefore, notAfter, [
    extension('2.5.29.19', seq(), true), // basicConstraints: not a CA
    extension('2.5.29.15', bits(Buffer.from([0x80]), 7), true), // keyUsage: digitalSignature
    extension('2.5.29.37', seq(oid('1.3.6.1.5.5.7.3.1'))), // extendedKeyUsage: serverAuth
    extension('2.5.29.17', seq(...names.map(altName))), // subjectAltName
  ]);
}

/** What signs leaves: the CA certificate (parsed) and its private key. */
export interface Signer {
  cert: X509Certificate;
  key: KeyObject;
}

/**
 * A server certificate (PEM) for `names` (address literals become iPAddress entries) with
 * `publicKey`, signed by `signer`, valid from an hour before `now` for `days`.
 */
export function issueLeaf(
  signer: Signer,
  names: readonly string[],
  publicKey: KeyObject,
  now: number,
  days: number,
): string {
  const first = names[0] ?? 'localhost';
  return certificate({
    subject: commonName(first.length <= 64 ? first : first.slice(0, 64)),
    issuer: subjectOf(signer.cert),
    publicKey,
    signingKey: signer.key,
    notBefore: new Date(now - 3_600_000),
    notAfter: new Date(now + days * 86_400_000),
    extensions: [
      extension('2.5.29.17', seq(...names.map(altName))), // subjectAltName
      extension('2.5.29.37', seq(oid('1.3.6.1.5.5.7.3.1'))), // extendedKeyUsage serverAuth
      extension('2.5.29.19', seq()), // basicConstraints CA:FALSE
      extension('2.5.29.14', octets(keyId(publicKey))), // subjectKeyIdentifier
      extension('2.5.29.35', seq(der(0x80, keyId(signer.cert.publicKey)))), // authorityKeyIdentifier
    ],
  });
}
