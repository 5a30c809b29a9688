/**
 * discovery/host — the DNS-rebinding guard of an API that runs without a token: a web page on
 * any site can make a browser on this machine send requests to 127.0.0.1 under the page's own
 * host name, so without a token only requests whose Host names a loopback address, the bind
 * address or a configured name are served (see docs/lease-api.md, "Authentication").
 */
import { isIP } from 'node:net';
import type { Guard } from './auth.ts';
import { errorBody } from './errors.ts';

/** The host part of a Host header: brackets and port dropped, lowercase, no trailing dot. */
export function hostOfHeader(header: string | undefined): string | undefined {
  if (!header) return undefined;
  let h = header.trim().toLowerCase();
  const bracket = /^\[([^\]]+)\](?::\d*)?$/.exec(h);
  if (bracket) h = bracket[1] ?? '';
  else if (/^[^:]*:\d*$/.test(h)) h = h.slice(0, h.lastIndexOf(':'));
  if (h.endsWith('.')) h = h.slice(0, -1);
  return h === '' ? undefined : h;
}

function isLoopback(host: string): boolean {
  if (host === 'localhost' || host === '::1') return true;
  return isIP(host) === 4 && host.startsWith('127.');
}

/**
 * Whether a request with this Host header may be served without a token: the host is loopback,
 * `bindHost` (when the API listens on one address) or one of `allowedHosts` (an entry starting
 * with a dot admits every name ending in it).
 */
export function hostAdmitter(
  bindHost: string | undefined,
  allowedHosts: string[],
): (hostHeader: string | undefined) => boolean {
  const allowed = new Set(
    allowedHosts.map((h) => hostOfHeader(h)).filter((h): h is string => h !== undefined),
  );
  const bind =
    bindHost === undefined || bindHost === '0.0.0.0' || bindHost === '::'
      ? undefined
      : hostOfHeader(bindHost);
  if (bind) allowed.add(bind);
  // `.example.svc` admits every name under it (Service names of a namespace).
  const suffixes = [...allowed].filter((h) => h.startsWith('.'));
  return (hostHeader) => {
    const host = hostOfHeader(hostHeader);
    return (
      host !== undefined && (isLoopback(host) || allowed.has(host) || suffixes.some((s) => host.endsWith(s)))
    );
  };
}

/** The guard that answers 403 to a request whose Host `admits` refuses. */
export function hostGuard(admits: (hostHeader: string | undefined) => boolean): Guard {
  return (req, reply, done) => {
    if (admits(req.headers.host)) return done();
    // The Host is not echoed: it is the attacker's text.
    reply
      .code(403)
      .send(
        errorBody(
          'forbidden_host',
          'without DISCOVERY_TOKEN the API answers only requests whose Host header names a loopback address, the bind address or a --discovery-allowed-hosts name',
        ),
      );
  };
}
