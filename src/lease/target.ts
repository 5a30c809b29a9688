/**
 * lease/target — what "target" means for cooldowns: a host name. Clients may send a host, a
 * host:port or a whole URL; all of them collapse to the lowercase host so that a block on
 * `https://Shop.example/x` also cools the proxy for `shop.example:443`.
 */

export class LeaseInputError extends Error {
  readonly field: string;
  constructor(field: string, message: string) {
    super(message);
    this.name = 'LeaseInputError';
    this.field = field;
  }
}

const HOST = /^[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?)*$/;
const IPV6 = /^[0-9a-f:.]+$/;

/**
 * Normalises a target to its host: lowercase, scheme/path/port/userinfo stripped, trailing dot
 * dropped, IPv6 kept in brackets. Empty or absent → undefined (no target). Throws
 * LeaseInputError(field 'target') for anything that is not a host.
 */
export function normalizeTarget(raw: string | undefined): string | undefined {
  if (raw === undefined) return undefined;
  const text = raw.trim();
  if (text === '') return undefined;
  if (text.length > 2048) throw new LeaseInputError('target', 'target is longer than 2048 characters');
  let host: string;
  if (/^[a-z][a-z0-9+.-]*:\/\//i.test(text)) {
    let url: URL;
    try {
      url = new URL(text);
    } catch {
      throw new LeaseInputError('target', `target "${text}" is not a valid URL`);
    }
    host = url.hostname;
  } else {
    host = text;
    const bracket = /^\[([^\]]+)\](?::\d{1,5})?$/.exec(host);
    if (bracket) host = `[${bracket[1]}]`;
    else if (/^[^:]+:\d{1,5}$/.test(host)) host = host.slice(0, host.lastIndexOf(':'));
  }
  host = host.toLowerCase();
  if (host.endsWith('.')) host = host.slice(0, -1);
  if (host.startsWith('[') && host.endsWith(']') && IPV6.test(host.slice(1, -1))) return host;
  if (host.length === 0 || host.length > 253 || !HOST.test(host)) {
    throw new LeaseInputError('target', `target "${text}" is not a host name, host:port or URL`);
  }
  return host;
}
