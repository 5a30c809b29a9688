/**
 * test/unit/config/egress — the effective deny list both kinds of proxy enforce: allowCIDRs punch
 * exact holes in the defaults, denyCIDRs always win, IPv4-mapped IPv6 counts as IPv4.
 */
import { describe, expect, it } from 'vitest';
import { deniedAddressMatcher, resolveEgressPolicy } from '../../../src/config/egress.ts';

describe('resolveEgressPolicy', () => {
  it('denies the default ranges and CONNECTs to 443 only', () => {
    const p = resolveEgressPolicy();
    expect(p.connectPorts).toEqual([443]);
    expect(p.httpPorts).toEqual([80, 443]);
    const denied = deniedAddressMatcher(p);
    for (const a of ['127.0.0.1', '10.1.2.3', '172.31.0.1', '192.168.0.1', '169.254.169.254', '100.64.0.1']) {
      expect(denied(a), a).toBe(true);
    }
    for (const a of ['::1', '::', 'fe80::1', 'fd12::1', '::ffff:127.0.0.1', '::ffff:a01:203', '0.0.0.0']) {
      expect(denied(a), a).toBe(true);
    }
    for (const a of ['8.8.8.8', '172.32.0.1', '100.128.0.1', '2001:db8::1', '::ffff:8.8.8.8']) {
      expect(denied(a), a).toBe(false);
    }
    expect(denied('not-an-address')).toBe(true);
  });

  it('allowCIDRs open exactly their range; denyCIDRs win over them', () => {
    const p = resolveEgressPolicy({
      allowCIDRs: ['127.0.0.1/32', '10.0.0.0/8'],
      denyCIDRs: ['10.9.0.0/16', '198.51.100.7/32'],
      connectPorts: [8443, 443, 443],
    });
    const denied = deniedAddressMatcher(p);
    expect(denied('127.0.0.1')).toBe(false);
    expect(denied('127.0.0.2')).toBe(true);
    expect(denied('10.1.0.1')).toBe(false);
    expect(denied('10.9.0.1')).toBe(true);
    expect(denied('198.51.100.7')).toBe(true);
    expect(p.connectPorts).toEqual([443, 8443]);
    expect(p.httpPorts).toEqual([80, 443, 8443]);
    // The list Squid gets is exact: 127.0.0.0/8 minus one address.
    expect(p.deniedCIDRs).toContain('127.0.0.0/32');
    expect(p.deniedCIDRs).toContain('127.0.0.2/31');
    expect(p.deniedCIDRs).not.toContain('10.0.0.0/8');
  });

  it('an allowCIDR covering everything leaves only denyCIDRs', () => {
    const p = resolveEgressPolicy({ allowCIDRs: ['0.0.0.0/0', '::/0'], denyCIDRs: ['fd00::/8'] });
    expect(p.deniedCIDRs).toEqual(['fd00::/8']);
  });
});
