/**
 * provider/local/auth — HTTP Basic proxy authentication for the local forward proxy: builds the
 * expected credential once and compares what a client sends in constant time; with a lease
 * check, a live lease's own credentials pass too.
 */
import { createHash, timingSafeEqual } from 'node:crypto';
import type { Credentials } from '../../api/credentials.ts';

export const PROXY_AUTH_REALM = 'egress-proxies-operator';

/** The `Proxy-Authenticate` challenge sent with every 407. */
export const PROXY_AUTHENTICATE = `Basic realm="${PROXY_AUTH_REALM}"`;

/** Asks whether `user:pass` belong to a live lease on this listener's instance (lease store). */
export type LeaseCredentialsCheck = (username: string, password: string) => boolean;

/**
 * The proxy's own credentials (the operator's probes use them) or, when `lease` is given, the
 * credentials of a live lease granted on this instance.
 */
export function proxyAuthChecker(
  creds: Credentials,
  lease: LeaseCredentialsCheck | undefined,
): (header: string | undefined) => boolean {
  const own = basicAuthChecker(creds);
  if (!lease) return own;
  return (header) => {
    if (own(header)) return true;
    const presented = decodeBasic(header);
    if (presented === undefined) return false;
    const colon = presented.indexOf(':');
    return lease(presented.slice(0, colon), presented.slice(colon + 1));
  };
}

/**
 * A checker bound to one set of credentials. Only a digest of the expected `user:pass` is kept,
 * so the plain password is not retained by the listener and comparisons are length-independent.
 */
export function basicAuthChecker(creds: Credentials): (header: string | undefined) => boolean {
  const expected = digest(`${creds.username}:${creds.password}`);
  return (header) => {
    const presented = decodeBasic(header);
    // Compare a digest even for malformed headers so timing does not reveal why it failed.
    const ok = timingSafeEqual(digest(presented ?? ''), expected);
    return ok && presented !== undefined;
  };
}

/** `user:pass` from a `Basic …` header value, or undefined when it is not one. */
export function decodeBasic(header: string | undefined): string | undefined {
  if (header === undefined) return undefined;
  const m = /^\s*basic\s+([A-Za-z0-9+/=_-]+)\s*$/i.exec(header);
  if (!m?.[1]) return undefined;
  const decoded = Buffer.from(m[1], 'base64').toString('utf8');
  return decoded.includes(':') ? decoded : undefined;
}

function digest(s: string): Buffer {
  return createHash('sha256').update(s, 'utf8').digest();
}
