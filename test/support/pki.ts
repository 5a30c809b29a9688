/**
 * test/support/pki — a throwaway CA and a server certificate signed by it, made in process with
 * the gateway's certificate writer (src/gateway/x509: P-256 keys, ECDSA with SHA-256), so a test
 * that needs a TLS origin starts no `openssl` child process and stays in the unit tier
 * (docs/testing.md). The certificates carry what strict verifiers ask for (OpenSSL's X509_STRICT,
 * which Python's `ssl` turns on).
 */
import { X509Certificate } from 'node:crypto';
import { issueLeaf, makeCaCertificate, newKeyPair } from '../../src/runtime/x509.ts';

export interface Pki {
  /** PEM of the CA that signed the leaf. */
  caCert: string;
  /** PEM of the leaf certificate, for `dnsNames` and `ipAddresses`. */
  cert: string;
  /** PEM (PKCS#8) of the leaf's private key. */
  key: string;
}

/**
 * A CA (CN `caName`) and a server certificate it signed for the given names, valid `days` days
 * (negative: a leaf that has expired that many days ago, for certificate-error tests).
 */
export function makePki(o: { caName: string; dnsNames: string[]; ipAddresses: string[]; days: number }): Pki {
  const ca = newKeyPair();
  const leaf = newKeyPair();
  const now = Date.now();
  const caCert = makeCaCertificate(o.caName, ca, now, Math.max(o.days, 2));
  const signer = { cert: new X509Certificate(caCert), key: ca.privateKey };
  const cert = issueLeaf(signer, [...o.dnsNames, ...o.ipAddresses], leaf.publicKey, now, o.days);
  return { caCert, cert, key: leaf.privateKey.export({ type: 'pkcs8', format: 'pem' }).toString() };
}
