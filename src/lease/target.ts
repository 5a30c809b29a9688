/**
 * lease/target — what "target" means for cooldowns: a host name. Clients may send a host, a
 * host:port or a whole URL; all of them collapse to the lowercase host so that a block on
 * `https://Shop.example/x` also cools the proxy for `shop.example:443`. An IP literal is a site
 * in the one spelling config/egress gives addresses, so `[::ffff:1.2.3.4]` and `1.2.3.4` are
 * one site.
 */
import { isIP } from 'node:net';
import { canonicalAddressText } from '../config/egress.ts';
import { LeaseInputError } from './errors.ts';

const HOST = /^[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?)*$/;
/** Characters that make a bare target more than an authority (path, query, userinfo, spaces). */
const NOT_AUTHORITY = /[/?#@\\\s]/;

/** Quotes what a client sent, shortened: error messages never echo a long input back. */
function shown(text: string): string {
  return JSON.stringify(text.length > 64 ? `${text.slice(0, 63)}…` : text);
}

/**
 * The host of an authority (`host` or `host:port`) as the WHATWG URL parser sees it, so a host
 * written any way (`2130706433`, `0x7f.1`, `127.0.0.1`, `Shop.Example`) becomes one key, and a
 * port the URL form refuses (`:99999`) is refused here too.
 */
function hostOfAuthority(authority: string, text: string): string {
  try {
    return new URL(`http://${authority}/`).hostname;
  } catch {
    throw new LeaseInputError('target', `target ${shown(text)} is not a host name, host:port or URL`);
  }
}

/**
 * Normalises a target to its host: lowercase, scheme/path/port/userinfo stripped, trailing dot
 * dropped, IPv4 in dotted-decimal, IPv6 in brackets in RFC 5952 form (`[2001:db8::1]`), an
 * IPv4-mapped IPv6 address as its IPv4 address. A bare host or host:port goes through the same
 * URL parser as the URL form, so both normalise one way; a bare IPv6 address (`2001:db8::1`,
 * what a CONNECT authority holds once its brackets are off) is read as the address, never as
 * host:port. Empty or absent → undefined (no target). Throws LeaseInputError(field 'target')
 * for anything that is not a host.
 */
export function normalizeTarget(raw: string | undefined): string | undefined {
  if (raw === undefined) return undefined;
  const known = normalized.get(raw);
  if (known !== undefined) return known;
  const host = normalizeFresh(raw);
  if (host !== undefined && raw.length <= 256) {
    // Crawlers ask for a handful of sites over and over; the URL parser is the costly part.
    if (normalized.size >= NORMALIZED_CACHE_SIZE) normalized.clear();
    normalized.set(raw, host);
  }
  return host;
}

/** Targets already normalised (raw text → host); only valid ones, so errors are thrown afresh. */
const normalized = new Map<string, string>();
const NORMALIZED_CACHE_SIZE = 4096;

function normalizeFresh(raw: string): string | undefined {
  const text = raw.trim();
  if (text === '') return undefined;
  if (text.length > 2048) throw new LeaseInputError('target', 'target is longer than 2048 characters');
  let host: string;
  if (/^[a-z][a-z0-9+.-]*:\/\//i.test(text)) {
    let url: URL;
    try {
      url = new URL(text);
    } catch {
      throw new LeaseInputError('target', `target ${shown(text)} is not a valid URL`);
    }
    // A scheme the URL parser does not know leaves the host as written: parse it as http's.
    host = url.hostname === '' ? '' : hostOfAuthority(url.host, text);
  } else {
    if (NOT_AUTHORITY.test(text)) {
      throw new LeaseInputError('target', `target ${shown(text)} is not a host name, host:port or URL`);
    }
    if (text.includes('%') && isIP(text) === 6) {
      throw new LeaseInputError('target', `target ${shown(text)} has a zone index, which names no site`);
    }
    host = hostOfAuthority(isIP(text) === 6 ? `[${text}]` : text, text);
  }
  host = host.toLowerCase();
  if (host.endsWith('.')) host = hostOfAuthority(host.slice(0, -1), text);
  if (host.startsWith('[') && host.endsWith(']')) {
    // The URL parser has validated and compressed it; the mapped form becomes the IPv4 site.
    const address = canonicalAddressText(host.slice(1, -1));
    if (address === undefined) {
      throw new LeaseInputError('target', `target ${shown(text)} is not a host name, host:port or URL`);
    }
    return isIP(address) === 6 ? `[${address}]` : address;
  }
  if (host.length === 0 || host.length > 253 || !HOST.test(host)) {
    throw new LeaseInputError('target', `target ${shown(text)} is not a host name, host:port or URL`);
  }
  return host;
}
