/**
 * test/unit/provider/egress-refusal — a refused destination says which rule refused it and which
 * config field would open it: the explanation itself (names, other spellings, NAT64 and 6to4
 * images, header safety), and a local proxy sending it as `X-Egress-Policy`, in the 403 body and
 * in a debug log line, for every rule kind over CONNECT and plain HTTP. Nothing is dialled.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { operatorPorts } from '../../../src/cmd/modes.ts';
import { resolveEgressPolicy } from '../../../src/config/egress.ts';
import { EGRESS_REFUSAL, EgressGuard } from '../../../src/provider/local/egress.ts';
import { createLocalProvider, type LocalProvider } from '../../../src/provider/local/index.ts';
import { captureLog } from '../../support/log.ts';
import { freePortRange } from '../../support/ports.ts';
import { callContext, createRequest, TEST_CREDENTIALS as creds } from '../../support/provider-calls.ts';
import { OWN_PORT, REFUSAL_POLICY, rawAnswer, refusalCases } from '../../support/refusals.ts';
import { basicAuthHeader } from '../../support/squid.ts';

const lab = { field: 'providers[lab].local.egressPolicy' };

/** The rule a guard gives for `host:port`, resolving names with `lookup`. */
async function ruleFor(
  host: string,
  port = 443,
  cfg: Parameters<typeof resolveEgressPolicy>[0] = {},
  lookup: (h: string) => Promise<string[]> = async () => [],
  http?: { method: string; path: string },
): Promise<string> {
  const guard = new EgressGuard(resolveEgressPolicy(cfg), { isOwnPort: () => false }, lookup, {
    ...lab,
    config: cfg,
  });
  const d = await guard.decide(host, port, http);
  if (d.allowed || d.reason === 'unresolvable') throw new Error(`${host} was not refused by a rule`);
  return d.rule;
}

describe('explaining a refusal', () => {
  it('names what a name resolved to, and the canonical form of another spelling', async () => {
    expect(await ruleFor('metadata.test', 443, {}, async () => ['169.254.169.254'])).toBe(
      'metadata.test resolves to 169.254.169.254, which is in 169.254.0.0/16 (link-local, cloud metadata), denied by default; to allow it, add a range covering 169.254.169.254 to providers[lab].local.egressPolicy.allowCIDRs',
    );
    expect(await ruleFor('::ffff:127.0.0.1')).toBe(
      '::ffff:127.0.0.1 is 127.0.0.1, which is in 127.0.0.0/8 (loopback), denied by default; to allow it, add a range covering 127.0.0.1 to providers[lab].local.egressPolicy.allowCIDRs',
    );
    expect(await ruleFor('fe80::1')).toContain('fe80::1 is in fe80::/10 (link-local), denied by default');
    expect(await ruleFor('64:ff9b:1::5')).toContain('is in 64:ff9b:1::/48 (local-use NAT64)');
  });

  it('names denyCIDRs over an allowed default range, and the IPv4 range an image needs opened', async () => {
    expect(await ruleFor('10.1.2.3', 443, { allowCIDRs: ['10.0.0.0/8'], denyCIDRs: ['10.1.0.0/16'] })).toBe(
      '10.1.2.3 is in 10.1.0.0/16 (denyCIDRs); to allow it, remove 10.1.0.0/16 from providers[lab].local.egressPolicy.denyCIDRs',
    );
    // An IPv6 allowCIDRs entry does not open an image; the explanation says what does.
    expect(await ruleFor('64:ff9b::a00:5', 443, { allowCIDRs: ['64:ff9b::/96'] })).toBe(
      '64:ff9b::a00:5 embeds 10.0.0.5 (NAT64), which is in 10.0.0.0/8 (private), denied by default; to allow it, add a range covering 10.0.0.5 to providers[lab].local.egressPolicy.allowCIDRs',
    );
    expect(await ruleFor('2002:cb00:7107::1', 443, { denyCIDRs: ['203.0.113.0/24'] })).toBe(
      '2002:cb00:7107::1 embeds 203.0.113.7 (6to4), which is in 203.0.113.0/24 (denyCIDRs); to allow it, remove 203.0.113.0/24 from providers[lab].local.egressPolicy.denyCIDRs',
    );
  });

  it('names the block of the effective list when the guard was not told the config', async () => {
    const guard = new EgressGuard(resolveEgressPolicy({ denyCIDRs: ['198.51.100.0/24'] }));
    expect(await guard.decide('198.51.100.9', 443)).toMatchObject({
      rule: '198.51.100.9 is in 198.51.100.0/24, which egressPolicy denies',
    });
  });

  it('keeps the line printable ASCII and bounded whatever name the client sent', async () => {
    const rule = await ruleFor(`${'ä'.repeat(300)}\u0001.test`, 443, {}, async () => ['10.0.0.1']);
    expect(rule).toMatch(/^[\x20-\x7e]+$/);
    expect(rule.length).toBeLessThanOrEqual(800);
    expect(rule).toContain('resolves to 10.0.0.1, which is in 10.0.0.0/8 (private)');
  });
});

describe('a local proxy refusing', () => {
  const auth = basicAuthHeader(creds.username, creds.password);
  const captured = captureLog('debug');
  const dialled: string[] = [];
  let provider: LocalProvider;
  let port: number;

  beforeAll(async () => {
    provider = createLocalProvider({
      name: 'lab',
      config: { portRange: await freePortRange(2), egressPolicy: REFUSAL_POLICY },
      log: captured.log,
      operator: operatorPorts({
        discoveryBindAddress: `127.0.0.1:${OWN_PORT}`,
        metricsBindAddress: '0',
        healthProbeBindAddress: '0',
      }),
      dial: (host, p) => {
        dialled.push(`${host}:${p}`);
        throw new Error('nothing is dialled in this test');
      },
    });
    port = (await provider.create(callContext(), createRequest('px-refusal'))).port as number;
  });
  afterAll(async () => {
    await provider.close();
    const all = captured.raw.join('');
    expect(all).not.toContain(creds.password);
    expect(all).not.toContain(auth.slice('Basic '.length));
  });

  for (const c of refusalCases('providers[lab].local.egressPolicy')) {
    it(`names the rule: ${c.name}`, async () => {
      const answer = await rawAnswer(port, c.requestLine, c.host, auth);
      expect(answer.status).toBe(403);
      expect(answer.headers['x-egress-policy']).toBe(c.rule);
      expect(answer.headers['x-proxy-error']).toBe('egress-denied');
      expect(answer.body).toBe(`${EGRESS_REFUSAL}: ${c.rule}\n`);
      expect(captured.lines).toContainEqual(
        expect.objectContaining({ level: 20, msg: 'egress denied by rule', reason: c.reason, rule: c.rule }),
      );
      expect(dialled).toEqual([]);
    });
  }

  it("names the local proxies' own ports as the operator's, with the field that sets them", async () => {
    const range = await freePortRange(1);
    const own = createLocalProvider({
      name: 'lab2',
      config: {
        portRange: range,
        egressPolicy: { allowCIDRs: ['127.0.0.0/8'], connectPorts: [range.from] },
      },
      log: captured.log,
    });
    try {
      const p = (await own.create(callContext(), createRequest('px-own'))).port as number;
      const answer = await rawAnswer(p, `CONNECT 127.0.0.1:${p} HTTP/1.1`, 'x', auth);
      expect(answer.headers['x-egress-policy']).toBe(
        `port ${p} on this host is the operator's local proxy ports (providers[lab2].local.portRange); no egress setting opens the operator's own listeners`,
      );
    } finally {
      await own.close();
    }
  });
});
