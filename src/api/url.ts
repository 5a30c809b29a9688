/**
 * api/url — URLs as the whole project writes and checks them: a proxy's published URL, the
 * credentialed URL inside a lease grant, the one http(s) check, and the one redaction for logs.
 */

/** An absolute http(s) URL with a written authority and a host. */
export function isHttpUrl(s: string): boolean {
  // WHATWG parsing would turn `https:///x` into host "x"; insist on a written authority.
  if (!/^https?:\/\/[^/?#\s]/i.test(s)) return false;
  try {
    const u = new URL(s);
    return (u.protocol === 'http:' || u.protocol === 'https:') && u.hostname !== '';
  } catch {
    return false;
  }
}

/** A URL fit for logs and messages: no userinfo, query or fragment (any of them may hold a key). */
export function redactUrl(raw: string): string {
  try {
    const u = new URL(raw.trim());
    return `${u.protocol}//${u.host}${u.pathname}`;
  } catch {
    return '(unparsable URL)';
  }
}

function hostForUrl(host: string): string {
  return host.includes(':') && !host.startsWith('[') ? `[${host}]` : host;
}

/** `http://host:port` without credentials, as published in status.url. */
export function proxyUrl(host: string, port: number): string {
  return `http://${hostForUrl(host)}:${port}`;
}

/** `http://user:pass@host:port`, only ever returned inside a lease grant. */
export function proxyUrlWithCredentials(
  host: string,
  port: number,
  creds: { username: string; password: string } | undefined,
): string {
  if (!creds) return proxyUrl(host, port);
  return `http://${encodeURIComponent(creds.username)}:${encodeURIComponent(creds.password)}@${hostForUrl(host)}:${port}`;
}
