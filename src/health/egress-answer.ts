/**
 * health/egress-answer — reading a "what is my IP" answer, and counting proxies that share an
 * egress IP. Pure functions for the egress-IP check (health/egress).
 */
import { isIP } from 'node:net';

/** `::ffff:a.b.c.d` → `a.b.c.d`; IPv6 lower-cased; anything else unchanged. */
function normaliseIp(ip: string): string {
  const m = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(ip);
  if (m && isIP(m[1] as string) === 4) return m[1] as string;
  return isIP(ip) === 6 ? ip.toLowerCase() : ip;
}

/** An IP from a comma list: the last entry is what the service's own edge saw (httpbin /ip). */
function ipFromField(v: unknown): string | undefined {
  if (typeof v !== 'string') return undefined;
  const last = v.split(',').at(-1)?.trim() ?? '';
  return isIP(last) ? normaliseIp(last) : undefined;
}

/**
 * The egress IP in a "what is my IP" answer: a plain-text address (`203.0.113.7\n`, ipify,
 * ifconfig.me) or JSON with `ip`, `origin` or `address` (ipify `?format=json`, httpbin `/ip`).
 * Undefined for anything else.
 */
export function parseEgressAnswer(body: string): string | undefined {
  const text = body.trim();
  if (text.startsWith('{')) {
    let doc: unknown;
    try {
      doc = JSON.parse(text);
    } catch {
      return undefined;
    }
    if (!doc || typeof doc !== 'object') return undefined;
    const o = doc as Record<string, unknown>;
    return ipFromField(o.ip) ?? ipFromField(o.origin) ?? ipFromField(o.address);
  }
  return isIP(text) ? normaliseIp(text) : undefined;
}

/** Number of proxies whose egress IP is shared with at least one other proxy. */
export function countDuplicates(ips: Iterable<string>): number {
  const counts = new Map<string, number>();
  for (const ip of ips) counts.set(ip, (counts.get(ip) ?? 0) + 1);
  let n = 0;
  for (const c of counts.values()) if (c > 1) n += c;
  return n;
}
