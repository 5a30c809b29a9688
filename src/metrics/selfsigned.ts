/**
 * metrics/selfsigned — a throwaway self-signed serving certificate (ECDSA P-256) for
 * `--metrics-secure` without `--metrics-cert-dir`, as controller-runtime makes one at start.
 * The certificate itself comes from the one certificate writer (runtime/x509): no dependency
 * tree in the runtime image and no `openssl` binary, which the container image does not have.
 */
import { newKeyPair, selfSignedServer } from '../runtime/x509.ts';

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

/** A self-signed serving certificate for `altNames` (default localhost, 127.0.0.1, ::1). */
export function selfSignedCertificate(opts: SelfSignedOptions = {}): SelfSignedCert {
  const keys = newKeyPair();
  const names = [...new Set(opts.altNames ?? ['localhost', '127.0.0.1', '::1'])];
  const start = opts.now ?? Date.now() - 3_600_000;
  const end = start + (opts.days ?? 365) * 86_400_000;
  return {
    cert: selfSignedServer(opts.commonName ?? 'egress-proxies-operator', names, keys, start, end),
    key: keys.privateKey.export({ type: 'pkcs8', format: 'pem' }) as string,
  };
}
