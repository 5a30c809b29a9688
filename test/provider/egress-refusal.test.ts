/**
 * test/provider/egress-refusal — a refused destination says which rule refused it and which
 * providers-config field would open it, so a user fixes the policy without reading the source.
 */
import { describe, expect, it } from 'vitest';
import { resolveEgressPolicy } from '../../src/config/egress.ts';
import { EgressGuard, explainRefusal } from '../../src/provider/local/egress.ts';

const lab = { field: 'providers[lab].local.egressPolicy' };

describe('egress refusals', () => {
  it('name the default range an address is in and allowCIDRs as the way to open it', () => {
    expect(explainRefusal({ reason: 'address', host: '127.0.0.1', address: '127.0.0.1' }, lab)).toBe(
      '127.0.0.1 is in 127.0.0.0/8 (loopback), denied by default; to allow it, add a range covering it to providers[lab].local.egressPolicy.allowCIDRs',
    );
    expect(
      explainRefusal({ reason: 'address', host: 'metadata.internal', address: '169.254.169.254' }, lab),
    ).toBe(
      'metadata.internal resolves to 169.254.169.254, which is in 169.254.0.0/16 (link-local, cloud metadata), denied by default; to allow it, add a range covering it to providers[lab].local.egressPolicy.allowCIDRs',
    );
    expect(explainRefusal({ reason: 'address', host: '::1', address: '::1' }, lab)).toContain(
      '::1/128 (loopback)',
    );
  });

  it('name denyCIDRs when the configured deny list refused, even inside a default range', () => {
    const source = {
      field: 'gateway.egressPolicy',
      config: { allowCIDRs: ['10.0.0.0/8'], denyCIDRs: ['10.1.0.0/16'] },
    };
    expect(explainRefusal({ reason: 'address', host: '10.1.2.3', address: '10.1.2.3' }, source)).toBe(
      '10.1.2.3 is in 10.1.0.0/16 (denyCIDRs); to allow it, remove it from gateway.egressPolicy.denyCIDRs',
    );
  });

  it('name the allowed ports and connectPorts for a refused port', () => {
    expect(explainRefusal({ reason: 'port', port: 8443, http: false, allowedPorts: [443] }, lab)).toBe(
      'port 8443 is not in connectPorts (443); to allow it, add it to providers[lab].local.egressPolicy.connectPorts',
    );
    expect(explainRefusal({ reason: 'port', port: 8080, http: true, allowedPorts: [80, 443] }, lab)).toBe(
      'port 8080 is not one plain http:// requests may use (80 and connectPorts: 80, 443); to allow it, add it to providers[lab].local.egressPolicy.connectPorts',
    );
  });

  it("say the operator's own listening port cannot be opened", () => {
    expect(explainRefusal({ reason: 'operator-port', port: 8090 }, lab)).toBe(
      "port 8090 on this host is one of the operator's own listeners; no setting opens it",
    );
  });

  it('keep a header-safe line whatever host name the client sent', () => {
    const rule = explainRefusal(
      { reason: 'address', host: 'evil\r\nX-Injected: 1', address: '10.0.0.1' },
      lab,
    );
    expect(rule).not.toMatch(/[\r\n]/);
    expect(rule).toMatch(/^[\x20-\x7e]+$/);
  });

  it('come from the guard with the rule that refused, checking the port before any lookup', async () => {
    const guard = new EgressGuard(
      resolveEgressPolicy({ connectPorts: [443] }),
      { isOwnPort: (p) => p === 8090 },
      async () => ['127.0.0.1'],
      lab,
    );
    expect(await guard.decide('shop.test', 8443)).toMatchObject({
      allowed: false,
      reason: 'port',
      rule: expect.stringContaining('connectPorts (443)'),
    });
    expect(await guard.decide('shop.test', 443)).toMatchObject({
      allowed: false,
      reason: 'address',
      rule: expect.stringContaining('shop.test resolves to 127.0.0.1, which is in 127.0.0.0/8 (loopback)'),
    });
    const own = new EgressGuard(
      resolveEgressPolicy({ connectPorts: [8090] }),
      { isOwnPort: (p) => p === 8090 },
      undefined,
      lab,
    );
    expect(await own.decide('127.0.0.1', 8090)).toMatchObject({
      reason: 'operator-port',
      rule: expect.stringContaining("operator's own listeners"),
    });
  });
});
