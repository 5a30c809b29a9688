/**
 * The crawler helpers of the TypeScript package (src/crawler): the "What to report" table as
 * functions, checked against the errors undici really raises on loopback (a proxy port nobody
 * listens on, a proxy that answers the CONNECT with 502 or 403); `retrying` and `leaseWaiting`
 * on a scripted client and an injected clock; `withLease` ending its lease however the block
 * ends, and not twice after a releasing report.
 */
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { fetch, ProxyAgent } from 'undici';
import { afterEach, describe, expect, it } from 'vitest';
import {
  classifyError,
  DENIED,
  DiscoveryError,
  leaseWaiting,
  NoneLeasableError,
  ORIGIN_FAULT,
  PROXY_FAULT,
  retrying,
  UNKNOWN,
  withLease,
} from '../../../src/crawler/index.ts';
import type { LeaseGrant, NoneLeasableCounts } from '../../../src/lease/types.ts';
import { closedPort } from '../../support/origins.ts';

const servers: http.Server[] = [];
afterEach(async () => {
  for (const s of servers.splice(0)) {
    s.closeAllConnections();
    await new Promise<void>((ok) => s.close(() => ok()));
  }
});

/** A "proxy" that answers every CONNECT with `status`. */
async function connectAnswering(status: number): Promise<number> {
  const server = http.createServer((_req, res) => res.writeHead(500).end());
  server.on('connect', (_req, socket) => {
    socket.end(`HTTP/1.1 ${status} Nope\r\nContent-Length: 0\r\n\r\n`);
  });
  servers.push(server);
  await new Promise<void>((ok) => server.listen(0, '127.0.0.1', () => ok()));
  return (server.address() as AddressInfo).port;
}

/** The error undici's fetch raises for `url` through the proxy on `proxyPort`. */
async function fetchError(proxyPort: number, url: string): Promise<unknown> {
  const agent = new ProxyAgent(`http://127.0.0.1:${proxyPort}`);
  try {
    await fetch(url, { dispatcher: agent });
  } catch (err) {
    return err;
  } finally {
    await agent.close();
  }
  throw new Error(`fetching ${url} through 127.0.0.1:${proxyPort} did not fail`);
}

describe('what to report', () => {
  it("classifies undici's real errors: an unreachable proxy is the proxy's fault, its 502 or 403 to a CONNECT is not", async () => {
    const nobody = await closedPort();
    // Any port fetch allows (it refuses "bad ports" such as 1 before connecting anywhere).
    const site = `127.0.0.1:${await closedPort()}`;
    expect(classifyError(await fetchError(nobody, `https://${site}/`))).toBe(PROXY_FAULT);
    expect(classifyError(await fetchError(nobody, `http://${site}/`))).toBe(PROXY_FAULT);
    expect(classifyError(await fetchError(await connectAnswering(502), `https://${site}/`))).toBe(
      ORIGIN_FAULT,
    );
    expect(classifyError(await fetchError(await connectAnswering(403), `https://${site}/`))).toBe(DENIED);
    expect(classifyError(new Error('socket hang up'))).toBe(UNKNOWN);
    expect(classifyError('not an error')).toBe(UNKNOWN);
  });
});

/** A clock the waits advance, so nothing really sleeps. */
function fakeTime(start = Date.parse('2026-12-02T10:00:00Z')) {
  let t = start;
  const slept: number[] = [];
  return {
    now: () => t,
    sleep: async (ms: number) => {
      slept.push(ms);
      t += ms;
    },
    slept,
  };
}

const COUNTS: NoneLeasableCounts = {
  matching: 2,
  ready: 2,
  healthy: 2,
  draining: 0,
  coolingDown: 0,
  coolingDownForTarget: 2,
  atCapacity: 0,
};

function grant(id: string): LeaseGrant {
  return { id, proxy: { namespace: 'crawl', name: 'eu-1' } } as unknown as LeaseGrant;
}

/** A client whose lease() answers from `script` in turn; records release and report calls. */
function scripted(script: (() => LeaseGrant)[]) {
  const calls: string[] = [];
  return {
    calls,
    client: {
      lease: async () => {
        const next = script.shift();
        if (!next) throw new Error('script ran out');
        return next();
      },
      release: async (id: string) => {
        calls.push(`release ${id}`);
      },
      report: async (id: string, p: { result: string; release?: boolean }) => {
        calls.push(`report ${id} ${p.result}${p.release === false ? ' keep' : ''}`);
        return { id, released: p.release !== false };
      },
    },
  };
}

describe('retrying and waiting', () => {
  it('retries while the API is unreachable, with growing waits, up to retryForMs', async () => {
    const time = fakeTime();
    let attempts = 0;
    const value = await retrying(
      async () => {
        attempts++;
        if (attempts === 1) throw new TypeError('fetch failed');
        if (attempts === 2) throw new DiscoveryError(503, 'no_leader', 'no leader');
        return 'ok';
      },
      { ...time, retryForMs: 10_000 },
    );
    expect(value).toBe('ok');
    expect(time.slept).toEqual([250, 500]);
    // Not an outage: no retry.
    await expect(
      retrying(
        async () => {
          throw new DiscoveryError(400, 'bad_request', 'bad');
        },
        { ...time },
      ),
    ).rejects.toThrow('bad');
    // Past retryForMs the last error comes out.
    const t2 = fakeTime();
    await expect(
      retrying(
        async () => {
          throw new TypeError('fetch failed');
        },
        { ...t2, retryForMs: 1000 },
      ),
    ).rejects.toThrow('fetch failed');
    expect(t2.slept).toEqual([250, 500]);
  });

  it('waits until retryAt when it is within waitMs, and gives the 409 back otherwise', async () => {
    const time = fakeTime();
    const at = (s: number) => new Date(time.now() + s * 1000).toISOString();
    const refused = (s: number | null) => () => {
      throw new NoneLeasableError('none', COUNTS, s === null ? null : at(s));
    };
    const { client } = scripted([refused(20), () => grant('g1')]);
    expect((await leaseWaiting(client, { target: 'shop.example' }, { ...time, waitMs: 30_000 })).id).toBe(
      'g1',
    );
    expect(time.slept).toEqual([20_000]);
    const late = scripted([refused(45)]);
    await expect(leaseWaiting(late.client, {}, { ...time, waitMs: 30_000 })).rejects.toBeInstanceOf(
      NoneLeasableError,
    );
    const never = scripted([refused(null)]);
    await expect(leaseWaiting(never.client, {}, { ...time, waitMs: 30_000 })).rejects.toBeInstanceOf(
      NoneLeasableError,
    );
  });
});

describe('withLease', () => {
  it('releases the lease when the block returns or throws', async () => {
    const ok = scripted([() => grant('a')]);
    expect(await withLease(ok.client, {}, async (l) => l.grant.id)).toBe('a');
    expect(ok.calls).toEqual(['release a']);
    const thrown = scripted([() => grant('b')]);
    await expect(
      withLease(thrown.client, {}, async () => {
        throw new Error('SSL: certificate verify failed');
      }),
    ).rejects.toThrow('certificate');
    expect(thrown.calls).toEqual(['release b']);
  });

  it('does not release again after a report that released it, and does after one that kept it', async () => {
    const reported = scripted([() => grant('c')]);
    await withLease(reported.client, {}, async (l) => {
      await l.report('blocked', { cooldownSeconds: 30 });
      expect(l.ended).toBe(true);
    });
    expect(reported.calls).toEqual(['report c blocked']);
    const kept = scripted([() => grant('d')]);
    await withLease(kept.client, {}, async (l) => {
      await l.report('blocked', { release: false });
    });
    expect(kept.calls).toEqual(['report d blocked keep', 'release d']);
  });
});
