/**
 * metrics/selfsigned — a throwaway self-signed serving certificate (ECDSA P-256) for
 * `--metrics-secure` without `--metrics-cert-dir`, as controller-runtime makes one at start.
 *
 * node:crypto makes the key and the signature but cannot build an X.509 structure, so this file
 * writes the one fixed certificate shape in DER itself (about sixty lines) instead of adding a
 * dependency tree to the runtime image or shelling out to an `openssl` binary the container
 * image does not have. Node's own X509Certificate parser checks the result in the tests.
 */
import { generateKeyPairSync, randomBytes, sign } from 'node:crypto';
import { isIP } from 'node:net';

export interface SelfSignedCert {
  /** PEM certificate. */
  cert: string;
  /** PEM PKCS#8 private key. */
  key: string;
}

export interface SelfSignedOptions {
  commonName?: string;
  /** Host names and IP addresses the certificate names (subjectAltName). */
  altNames?: string[];
  /** Validity; default one year. */
  days?: number;
  /** Start of validity in ms; default now minus an hour (clock skew). */
  now?: number;
}

// ---- a minimal DER writer: only the types a certificate needs ----

function len(n: number): Buffer {
  if (n < 0x80) return Buffer.from([n]);
  const bytes: number[] = [];
  for (let v = n; v > 0; v = Math.floor(v / 256)) bytes.unshift(v & 0xff);
  return Buffer.from([0x80 | bytes.length, ...bytes]);
}
const tlv = (tag: number, body: Buffer): Buffer =>
  Buffer.concat([Buffer.from([tag]), len(body.length), body]);
const seq = (...items: Buffer[]): Buffer => tlv(0x30, Buffer.concat(items));
const set = (...items: Buffer[]): Buffer => tlv(0x31, Buffer.concat(items));
const explicit = (n: number, inner: Buffer): Buffer => tlv(0xa0 + n, inner);
const octets = (b: Buffer): Buffer => tlv(0x04, b);
/** A BIT STRING; `unused` trailing bits of the last byte (DER wants them counted, not sent as 0s). */
const bits = (b: Buffer, unused = 0): Buffer => tlv(0x03, Buffer.concat([Buffer.from([unused]), b]));
const utf8 = (s: string): Buffer => tlv(0x0c, Buffer.from(s, 'utf8'));

function oid(dotted: string): Buffer {
  const [a = 0, b = 0, ...rest] = dotted.split('.').map(Number);
  const out = [40 * a + b];
  for (const n of rest) {
    const chunk = [n & 0x7f];
    for (let v = Math.floor(n / 128); v > 0; v = Math.floor(v / 128)) chunk.unshift((v & 0x7f) | 0x80);
    out.push(...chunk);
  }
  return tlv(0x06, Buffer.from(out));
}

/** A non-negative INTEGER in DER's minimal form: no leading zero bytes unless the sign needs one. */
function positiveInteger(b: Buffer): Buffer {
  let start = 0;
  while (start < b.length - 1 && b[start] === 0) start++;
  const trimmed = b.subarray(start);
  const body = (trimmed[0] ?? 0) & 0x80 ? Buffer.concat([Buffer.from([0]), trimmed]) : trimmed;
  return tlv(0x02, body);
}

/** UTCTime before 2050, GeneralizedTime from then on (RFC 5280 §4.1.2.5). */
function time(ms: number): Buffer {
  const iso = new Date(ms).toISOString().replace(/[-:T]/g, '').slice(0, 14);
  const year = Number(iso.slice(0, 4));
  return year < 2050 ? tlv(0x17, Buffer.from(`${iso.slice(2)}Z`)) : tlv(0x18, Buffer.from(`${iso}Z`));
}

function ipBytes(ip: string): Buffer {
  if (isIP(ip) === 4) return Buffer.from(ip.split('.').map(Number));
  const [head = '', tail = ''] = ip.split('::');
  const parts = (s: string) => (s === '' ? [] : s.split(':'));
  const h = parts(head);
  const t = parts(tail);
  const groups = ip.includes('::') ? [...h, ...Array(8 - h.length - t.length).fill('0'), ...t] : h;
  return Buffer.from(
    groups.flatMap((g) => [(Number.parseInt(g, 16) >> 8) & 0xff, Number.parseInt(g, 16) & 0xff]),
  );
}

function extension(id: string, critical: boolean, value: Buffer): Buffer {
  return seq(oid(id), ...(critical ? [tlv(0x01, Buffer.from([0xff]))] : []), octets(value));
}

const ECDSA_SHA256 = seq(oid('1.2.840.10045.4.3.2'));

/** A self-signed serving certificate for `altNames` (default localhost, 127.0.0.1, ::1). */
export function selfSignedCertificate(opts: SelfSignedOptions = {}): SelfSignedCert {
  const { publicKey, privateKey } = generateKeyPairSync('ec', { namedCurve: 'prime256v1' });
  const cn = opts.commonName ?? 'egress-proxies-operator';
  const names = [...new Set(opts.altNames ?? ['localhost', '127.0.0.1', '::1'])];
  const start = opts.now ?? Date.now() - 3_600_000;
  const end = start + (opts.days ?? 365) * 86_400_000;
  const name = seq(set(seq(oid('2.5.4.3'), utf8(cn))));
  const san = seq(
    ...names.map((n) => (isIP(n) ? tlv(0x87, ipBytes(n)) : tlv(0x82, Buffer.from(n.toLowerCase(), 'ascii')))),
  );
  const serial = randomBytes(16);
  const tbs = seq(
    explicit(0, positiveInteger(Buffer.from([2]))),
    positiveInteger(serial),
    ECDSA_SHA256,
    name,
    seq(time(start), time(end)),
    name,
    publicKey.export({ type: 'spki', format: 'der' }),
    explicit(
      3,
      seq(
        extension('2.5.29.19', true, seq()), // basicConstraints: not a CA
        extension('2.5.29.15', true, bits(Buffer.from([0x80]), 7)), // keyUsage: digitalSignature
        extension('2.5.29.37', false, seq(oid('1.3.6.1.5.5.7.3.1'))), // extKeyUsage: serverAuth
        extension('2.5.29.17', false, san),
      ),
    ),
  );
  const der = seq(tbs, ECDSA_SHA256, bits(sign('sha256', tbs, privateKey)));
  const b64 = der.toString('base64').replace(/.{1,64}/g, '$&\n');
  return {
    cert: `-----BEGIN CERTIFICATE-----\n${b64}-----END CERTIFICATE-----\n`,
    key: privateKey.export({ type: 'pkcs8', format: 'pem' }) as string,
  };
}
