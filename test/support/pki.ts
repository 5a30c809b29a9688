/**
 * test/support/pki — a throwaway CA and a server certificate signed by it, made in process with
 * node:crypto (P-256 keys, ECDSA with SHA-256, DER written here), so a test that needs a TLS origin
 * starts no `openssl` child process and stays in the unit tier (docs/testing.md). The certificates
 * carry what strict verifiers ask for (OpenSSL's X509_STRICT, which Python's `ssl` turns on): the
 * CA has basicConstraints CA:TRUE, keyUsage keyCertSign/cRLSign and a subjectKeyIdentifier; the
 * leaf has subjectAltName, extendedKeyUsage serverAuth, basicConstraints CA:FALSE and an
 * authorityKeyIdentifier.
 */
import { createHash, generateKeyPairSync, type KeyObject, randomBytes, sign } from 'node:crypto';

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

function utcTime(d: Date): Buffer {
  const s = d.toISOString(); // 2025-01-02T03:04:05.678Z
  const t = `${s.slice(2, 4)}${s.slice(5, 7)}${s.slice(8, 10)}${s.slice(11, 13)}${s.slice(14, 16)}${s.slice(17, 19)}Z`;
  return der(0x17, Buffer.from(t, 'ascii'));
}

const name = (cn: string) => seq(set(seq(oid('2.5.4.3'), der(0x0c, Buffer.from(cn, 'utf8')))));

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

function ipv4(address: string): Buffer {
  return Buffer.from(address.split('.').map(Number));
}

const ECDSA_SHA256 = seq(oid('1.2.840.10045.4.3.2'));

function certificate(o: {
  subject: string;
  issuer: string;
  publicKey: KeyObject;
  signingKey: KeyObject;
  days: number;
  extensions: Buffer[];
}): string {
  const serial = randomBytes(16);
  serial[0] = (serial[0] ?? 0) & 0x7f;
  const now = Date.now();
  const tbs = seq(
    explicit(0, integer(Buffer.from([2]))),
    integer(serial),
    ECDSA_SHA256,
    name(o.issuer),
    seq(utcTime(new Date(now - 60 * 60_000)), utcTime(new Date(now + o.days * 86_400_000))),
    name(o.subject),
    o.publicKey.export({ type: 'spki', format: 'der' }),
    explicit(3, seq(...o.extensions)),
  );
  const cert = seq(tbs, ECDSA_SHA256, bits(sign('sha256', tbs, o.signingKey)));
  const b64 = cert.toString('base64').replace(/.{64}/g, '$&\n');
  return `-----BEGIN CERTIFICATE-----\n${b64}${b64.endsWith('\n') ? '' : '\n'}-----END CERTIFICATE-----\n`;
}

export interface Pki {
  /** PEM of the CA that signed the leaf. */
  caCert: string;
  /** PEM of the leaf certificate, for `dnsNames` and `ipAddresses`. */
  cert: string;
  /** PEM (PKCS#8) of the leaf's private key. */
  key: string;
}

/** A CA (CN `caName`) and a server certificate it signed for the given names, valid `days` days. */
export function makePki(o: { caName: string; dnsNames: string[]; ipAddresses: string[]; days: number }): Pki {
  const ca = generateKeyPairSync('ec', { namedCurve: 'prime256v1' });
  const leaf = generateKeyPairSync('ec', { namedCurve: 'prime256v1' });
  const caId = keyId(ca.publicKey);
  const caCert = certificate({
    subject: o.caName,
    issuer: o.caName,
    publicKey: ca.publicKey,
    signingKey: ca.privateKey,
    days: o.days,
    extensions: [
      extension('2.5.29.19', seq(TRUE), true), // basicConstraints CA:TRUE
      extension('2.5.29.15', bits(Buffer.from([0x06]), 1), true), // keyUsage keyCertSign, cRLSign
      extension('2.5.29.14', octets(caId)), // subjectKeyIdentifier
    ],
  });
  const san = seq(
    ...o.dnsNames.map((n) => der(0x82, Buffer.from(n, 'ascii'))),
    ...o.ipAddresses.map((a) => der(0x87, ipv4(a))),
  );
  const cert = certificate({
    subject: o.dnsNames[0] ?? 'localhost',
    issuer: o.caName,
    publicKey: leaf.publicKey,
    signingKey: ca.privateKey,
    days: o.days,
    extensions: [
      extension('2.5.29.17', san), // subjectAltName
      extension('2.5.29.37', seq(oid('1.3.6.1.5.5.7.3.1'))), // extendedKeyUsage serverAuth
      extension('2.5.29.19', seq()), // basicConstraints CA:FALSE
      extension('2.5.29.14', octets(keyId(leaf.publicKey))), // subjectKeyIdentifier
      extension('2.5.29.35', seq(der(0x80, caId))), // authorityKeyIdentifier
    ],
  });
  return { caCert, cert, key: leaf.privateKey.export({ type: 'pkcs8', format: 'pem' }).toString() };
}
