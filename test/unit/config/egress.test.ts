/**
 * test/unit/config/egress — the effective deny list both kinds of proxy enforce: allowCIDRs punch
 * exact holes in the defaults, denyCIDRs always win, IPv4-mapped IPv6 counts as IPv4, NAT64 and
 * 6to4 addresses are decided by the IPv4 address they embed, the special ranges are denied.
 */
import { describe, expect, it } from 'vitest';
import {
  canonicalAddressText,
  deniedAddressMatcher,
  resolveEgressPolicy,
} from '../../../src/config/egress.ts';

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

describe('addresses that stand for others', () => {
  const denied = deniedAddressMatcher(resolveEgressPolicy());

  it('denies the special ranges no public site lives in', () => {
    for (const a of [
      '192.0.0.8',
      '192.0.0.255',
      '224.0.0.1',
      '239.255.255.250',
      '240.0.0.1',
      '255.255.255.255',
      'ff02::1',
      'ff05::1:3',
      '64:ff9b:1::a00:1',
    ]) {
      expect(denied(a), a).toBe(true);
    }
    // Neighbours stay open; documentation ranges route nowhere and are not listed.
    for (const a of ['192.0.1.1', '223.255.255.255', '192.0.2.1', '2001:db8::1', 'fe00::1']) {
      expect(denied(a), a).toBe(false);
    }
  });

  it('IPv4-mapped IPv6 is the IPv4 address, in every spelling', () => {
    for (const a of [
      '::ffff:10.0.0.1',
      '::FFFF:a00:1',
      '0:0:0:0:0:ffff:0a00:0001',
      '::ffff:255.255.255.255',
    ]) {
      expect(denied(a), a).toBe(true);
    }
    expect(denied('::ffff:1.2.3.4')).toBe(false);
    expect(canonicalAddressText('::ffff:1.2.3.4')).toBe('1.2.3.4');
    expect(canonicalAddressText('::FFFF:102:304')).toBe('1.2.3.4');
    expect(canonicalAddressText('2001:DB8:0:0::1')).toBe('2001:db8::1');
    expect(canonicalAddressText('example.com')).toBeUndefined();
  });

  it('a zone index is not an address (refused, never a crash)', () => {
    expect(canonicalAddressText('fe80::1%eth0')).toBeUndefined();
    expect(denied('fe80::1%eth0')).toBe(true);
    expect(denied('2001:db8::1%1')).toBe(true);
  });

  it('NAT64 and 6to4 addresses are decided by the IPv4 address they embed', () => {
    for (const v4 of [
      '10.0.0.1',
      '127.0.0.1',
      '169.254.169.254',
      '192.168.1.1',
      '100.64.0.1',
      '0.0.0.0',
      '224.0.0.1',
    ]) {
      const [a = 0, b = 0, c = 0, d = 0] = v4.split('.').map(Number);
      const hex = (x: number, y: number) => ((x << 8) | y).toString(16);
      const nat64 = `64:ff9b::${v4}`;
      const sixToFour = `2002:${hex(a, b)}:${hex(c, d)}::1`;
      expect(denied(nat64), nat64).toBe(true);
      expect(denied(`64:ff9b::${hex(a, b)}:${hex(c, d)}`), nat64).toBe(true);
      expect(denied(sixToFour), sixToFour).toBe(true);
    }
    // A public IPv4 address behind NAT64 (DNS64 in an IPv6-only cluster) stays reachable.
    expect(denied('64:ff9b::8.8.8.8')).toBe(false);
    expect(denied('2002:808:808::1')).toBe(false);
  });

  it('the images follow the effective IPv4 list: allowing the IPv4 range opens them, an IPv6 allow does not', () => {
    const opened = deniedAddressMatcher(resolveEgressPolicy({ allowCIDRs: ['10.0.0.0/8'] }));
    expect(opened('64:ff9b::10.1.2.3')).toBe(false);
    expect(opened('2002:a01:203::1')).toBe(false);
    const v6only = deniedAddressMatcher(resolveEgressPolicy({ allowCIDRs: ['64:ff9b::/96', '2002::/16'] }));
    expect(v6only('64:ff9b::10.1.2.3')).toBe(true);
    expect(v6only('2002:a01:203::1')).toBe(true);
    const closed = deniedAddressMatcher(resolveEgressPolicy({ denyCIDRs: ['203.0.113.0/24'] }));
    expect(closed('64:ff9b::203.0.113.9')).toBe(true);
    expect(closed('2002:cb00:7109::1')).toBe(true);
  });

  it('the list Squid gets carries the images as exact CIDR blocks', () => {
    const p = resolveEgressPolicy();
    expect(p.deniedCIDRs).toContain('64:ff9b::a00:0/104');
    expect(p.deniedCIDRs).toContain('2002:a00::/24');
    expect(p.deniedCIDRs).toContain('64:ff9b::e000:0/99');
    expect(p.deniedCIDRs).toContain('2002:e000::/19');
    expect(p.deniedCIDRs).toContain('224.0.0.0/3');
  });
});
