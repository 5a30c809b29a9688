/**
 * The gateway user-name grammar (docs/gateway.md): options become a selector, a namespace and a
 * sticky session; anything else is refused with a message naming what is wrong.
 */
import { describe, expect, it } from 'vitest';
import { gatewayAuthChecker } from '../../../src/gateway/auth.ts';
import { parseUsername } from '../../../src/gateway/username.ts';

describe('gateway user names', () => {
  it('reads pool, label, namespace, session and ttl options', () => {
    expect(parseUsername('crawler-pool-eu-session-a1b2')).toEqual({
      ok: true,
      options: { selector: 'pool=eu', session: 'a1b2', sessionTtlSeconds: 600 },
    });
    expect(parseUsername('crawler-label-zone_eu1-ns-crawl-ttl-30')).toEqual({
      ok: true,
      options: { selector: 'zone=eu1', namespace: 'crawl', sessionTtlSeconds: 30 },
    });
    expect(parseUsername('crawler')).toEqual({ ok: true, options: { sessionTtlSeconds: 600 } });
  });

  it('reads inspect-off (HTTPS tunnelled untouched) alone or with other options', () => {
    expect(parseUsername('crawler-inspect-off')).toEqual({
      ok: true,
      options: { sessionTtlSeconds: 600, inspect: false },
    });
    expect(parseUsername('crawler-session-s1-inspect-off-pool-eu')).toEqual({
      ok: true,
      options: { session: 's1', selector: 'pool=eu', sessionTtlSeconds: 600, inspect: false },
    });
    expect(parseUsername('crawler-inspect-on')).toEqual({ ok: true, options: { sessionTtlSeconds: 600 } });
    expect(parseUsername('crawler-inspect-no')).toEqual({
      ok: false,
      message:
        'gateway user name: option "inspect" is on or off, e.g. crawler-inspect-off (see docs/gateway.md)',
    });
  });

  it('reads region and zone names with dashes, up to the next option', () => {
    expect(parseUsername('crawler-zone-europe-west1-b')).toEqual({
      ok: true,
      options: { selector: 'topology.kubernetes.io/zone=europe-west1-b', sessionTtlSeconds: 600 },
    });
    expect(parseUsername('crawler-pool-eu-region-us-east-1-session-s1-zone-us-east-1a')).toEqual({
      ok: true,
      options: {
        selector: 'pool=eu,topology.kubernetes.io/region=us-east-1,topology.kubernetes.io/zone=us-east-1a',
        session: 's1',
        sessionTtlSeconds: 600,
      },
    });
    // The first part after the option name is always its value, even when it is an option name.
    expect(parseUsername('crawler-zone-ns-1')).toEqual({
      ok: true,
      options: { selector: 'topology.kubernetes.io/zone=ns-1', sessionTtlSeconds: 600 },
    });
    expect(parseUsername('crawler-zone-nas1')).toMatchObject({
      options: { selector: 'topology.kubernetes.io/zone=nas1' },
    });
  });

  it.each([
    ['crawler-zone', 'option "zone" needs a name'],
    ['crawler-zone-europe--b', 'option "zone" needs a name'],
    ['crawler-region-eu-', 'option "region" needs a name'],
    ['crawler-zone-a-zone-b', 'option "zone" is given twice'],
    ['crawler-zone-_a', 'option "zone" is a label value'],
    [`crawler-zone-${'a'.repeat(40)}-${'b'.repeat(30)}`, 'option "zone" is a label value'],
  ])('refuses the location option in %s', (name, message) => {
    const r = parseUsername(name);
    expect(r.ok).toBe(false);
    if (!r.ok) expect(r.message).toContain(message);
  });

  it.each([
    ['robot-session-1', 'must start with "crawler"'],
    ['crawler-color-red', 'unknown option "color"'],
    ['crawler-session', 'option "session" needs a value'],
    ['crawler-session-a-session-b', 'option "session" is given twice'],
    ['crawler-ttl-0', 'option "ttl"'],
    ['crawler-label-zone', 'option "label" takes <key>_<value>'],
  ])('refuses %s', (name, message) => {
    const r = parseUsername(name);
    expect(r.ok).toBe(false);
    if (!r.ok) expect(r.message).toContain(message);
  });

  it('checks the token in constant time and never echoes it', () => {
    const check = gatewayAuthChecker('s3cret');
    const header = (u: string, p: string) => `Basic ${Buffer.from(`${u}:${p}`).toString('base64')}`;
    expect(check(header('crawler-session-1', 's3cret')).ok).toBe(true);
    const wrong = check(header('crawler', 'guess'));
    expect(wrong).toEqual({ ok: false, message: 'wrong gateway token' });
    expect(check(undefined).ok).toBe(false);
    // Without a token any password passes (the listener is loopback-only), the grammar still applies.
    expect(gatewayAuthChecker(undefined)(header('crawler-x-1', '')).ok).toBe(false);
    expect(gatewayAuthChecker(undefined)(header('crawler', '')).ok).toBe(true);
  });
});
