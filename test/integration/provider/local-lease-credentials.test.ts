/**
 * Per-lease credentials on the local provider: a grant's URL carries credentials of its own,
 * which the local proxy accepts only while that lease lives; the proxy's own credentials keep
 * working for probes and are never handed out.
 */
import { fetch, ProxyAgent } from 'undici';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { parseLeaseState } from '../../../src/lease/durable.ts';
import { LeaseStore } from '../../../src/lease/store.ts';
import type { LeaseGrant, ProxyInfo } from '../../../src/lease/types.ts';
import {
  createLocalProvider,
  LOCAL_ID_PREFIX,
  type LocalProvider,
} from '../../../src/provider/local/index.ts';
import { basicAuth } from '../../support/cli.ts';
import { FakeClock } from '../../support/clock.ts';
import { proxyInfo } from '../../support/lease.ts';
import { captureLog } from '../../support/log.ts';
import { type Origin, startHttpOrigin } from '../../support/origins.ts';
import { freePortRange } from '../../support/ports.ts';
import { callContext, createRequest, TEST_CREDENTIALS } from '../../support/provider-calls.ts';

const perLease = (instance: string) => instance.startsWith(LOCAL_ID_PREFIX);

/** Status of a plain-HTTP GET in absolute form through `proxyUrl` with the URL's credentials. */
async function via(proxyUrl: string, url: string): Promise<number> {
  const u = new URL(proxyUrl);
  const dispatcher = new ProxyAgent({ uri: `http://${u.host}`, token: basicAuth(proxyUrl) });
  try {
    const res = await fetch(url, { dispatcher, signal: AbortSignal.timeout(5000) });
    await res.arrayBuffer();
    return res.status;
  } catch (err) {
    // undici turns a 407 on CONNECT into an error; report it as the status it was.
    const msg = String((err as Error & { cause?: Error }).cause?.message ?? err);
    if (msg.includes('407')) return 407;
    throw err;
  } finally {
    await dispatcher.close();
  }
}

describe('local provider: per-lease credentials', () => {
  let origin: Origin;
  const captured = captureLog('debug');
  const providers: LocalProvider[] = [];
  const stores: LeaseStore[] = [];

  beforeAll(async () => {
    origin = await startHttpOrigin({ defaultStatus: 204 });
  });
  afterEach(async () => {
    for (const s of stores.splice(0)) s.close();
    await Promise.all(providers.splice(0).map((p) => p.close()));
  });
  afterAll(async () => {
    await origin.close();
    const all = captured.raw.join('');
    expect(all).not.toContain(TEST_CREDENTIALS.password);
  });

  /** A local proxy serving Proxy crawl/a, known to a lease store that issues per-lease credentials. */
  async function setup() {
    const clock = new FakeClock();
    let leases: LeaseStore | undefined;
    const provider = createLocalProvider({
      name: 'dev',
      config: {
        portRange: await freePortRange(5),
        egressPolicy: { allowCIDRs: ['127.0.0.1/32'], connectPorts: [origin.port] },
      },
      log: captured.log,
      leaseCredentials: (instance, username, password) =>
        leases?.acceptsLeaseCredentials(instance, username, password) ?? false,
    });
    providers.push(provider);
    const inst = await provider.create(callContext(), createRequest('px-a'));
    leases = new LeaseStore({ clock, perLeaseCredentials: perLease });
    stores.push(leases);
    const info: ProxyInfo = {
      key: 'crawl/a',
      namespace: 'crawl',
      name: 'a',
      uid: 'uid-a',
      labels: {},
      phase: 'Ready',
      healthy: true,
      draining: false,
      deleting: false,
      maxLeases: 0,
      host: '127.0.0.1',
      port: inst.port!,
      credentials: TEST_CREDENTIALS,
      instance: inst.id,
    };
    leases.upsertProxy(info);
    const grant = (): LeaseGrant => {
      const out = leases!.lease({ ttlSeconds: 60 });
      if (!out.granted) throw new Error('expected a grant');
      return out.grant;
    };
    const own = `http://${TEST_CREDENTIALS.username}:${TEST_CREDENTIALS.password}@127.0.0.1:${inst.port}`;
    return { clock, leases, provider, inst, info, grant, own };
  }

  it('a grant carries its own credentials; they work while the lease lives and get 407 after release', async () => {
    const { leases, grant, own } = await setup();
    const a = grant();
    const b = grant();
    const ua = new URL(a.proxy.url);
    expect(decodeURIComponent(ua.username)).toBe(`lease-${a.id}`);
    expect(ua.password.length).toBeGreaterThanOrEqual(20);
    expect(a.proxy.url).not.toContain(TEST_CREDENTIALS.password);
    expect(new URL(b.proxy.url).password).not.toBe(ua.password);

    const target = `${origin.baseUrl}/status/204`;
    expect(await via(a.proxy.url, target)).toBe(204);
    expect(await via(b.proxy.url, target)).toBe(204);

    expect(leases.release(a.id)).toBe(true);
    expect(await via(a.proxy.url, target)).toBe(407);
    // Another lease on the same proxy keeps working, and so do the proxy's own credentials (probes).
    expect(await via(b.proxy.url, target)).toBe(204);
    expect(await via(own, target)).toBe(204);
    // A lease's user name with another lease's password is refused.
    const forged = new URL(b.proxy.url);
    forged.password = ua.password;
    expect(await via(forged.toString(), target)).toBe(407);
  });

  it('expiry and a report with release end the credentials too', async () => {
    const { clock, leases, grant } = await setup();
    const target = `${origin.baseUrl}/status/204`;
    const a = grant();
    const b = grant();
    expect(await via(a.proxy.url, target)).toBe(204);
    expect(leases.report(b.id, { result: 'success' })).toBe(true);
    expect(await via(b.proxy.url, target)).toBe(407);
    clock.advance(61_000);
    expect(await via(a.proxy.url, target)).toBe(407);
  });

  it('a lease on another instance is not accepted here', async () => {
    const { leases, grant } = await setup();
    const a = grant();
    const u = new URL(a.proxy.url);
    expect(
      leases.acceptsLeaseCredentials(
        'local/px-other',
        decodeURIComponent(u.username),
        decodeURIComponent(u.password),
      ),
    ).toBe(false);
    expect(
      leases.acceptsLeaseCredentials(
        'local/px-a',
        decodeURIComponent(u.username),
        decodeURIComponent(u.password),
      ),
    ).toBe(true);
  });

  it('per-lease credentials survive a checkpoint and restore', async () => {
    const { clock, leases, grant, info } = await setup();
    const a = grant();
    const state = parseLeaseState(JSON.stringify(leases.exportState()));
    expect(JSON.stringify(state)).not.toContain(new URL(a.proxy.url).password);
    const next = new LeaseStore({ clock, perLeaseCredentials: perLease });
    stores.push(next);
    next.upsertProxy(info);
    next.restoreState(state);
    const u = new URL(a.proxy.url);
    const user = decodeURIComponent(u.username);
    const pass = decodeURIComponent(u.password);
    expect(next.acceptsLeaseCredentials(info.instance!, user, pass)).toBe(true);
    expect(next.acceptsLeaseCredentials(info.instance!, user, `${pass}x`)).toBe(false);
    next.release(a.id);
    expect(next.acceptsLeaseCredentials(info.instance!, user, pass)).toBe(false);
  });

  it('proxies not served per lease keep handing out the proxy credentials', async () => {
    const clock = new FakeClock();
    const leases = new LeaseStore({ clock, perLeaseCredentials: perLease });
    stores.push(leases);
    leases.upsertProxy(
      proxyInfo('s', { credentials: { username: 'u', password: 'p' }, instance: 'k8s/pod-1' }),
    );
    const out = leases.lease();
    expect(out.granted && out.grant.proxy.url).toBe('http://u:p@10.0.0.1:3128');
  });
});
