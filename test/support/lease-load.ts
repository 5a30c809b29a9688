/**
 * test/support/lease-load — drives the discovery API the way a crawler fleet does, for the
 * cluster authority tests: a round-robin TCP front end on loopback spreading every connection
 * over the replicas (a Service without session affinity), and N concurrent clients leasing,
 * renewing, reporting and releasing through it, one new connection per request. It checks as it
 * goes what one authority guarantees: no proxy ever holds more leases than its maxLeases, and
 * no grant hands out a proxy a `blocked` report already cooled down for that target.
 */
import http from 'node:http';
import net from 'node:net';
import { seededRandom } from './random.ts';

export interface Front {
  url: string;
  /** Connections accepted per backend port. */
  hits: Map<number, number>;
  close(): Promise<void>;
}

/** Round-robin over `ports`; a backend that refuses is skipped for that connection. */
export async function roundRobinFront(ports: number[]): Promise<Front> {
  let next = 0;
  const hits = new Map<number, number>();
  const sockets = new Set<net.Socket>();
  const server = net.createServer((client) => {
    sockets.add(client);
    client.on('close', () => sockets.delete(client));
    client.on('error', () => {});
    const attempt = (tries: number) => {
      const port = ports[next++ % ports.length] as number;
      const upstream = net.connect({ host: '127.0.0.1', port });
      sockets.add(upstream);
      upstream.on('close', () => sockets.delete(upstream));
      let connected = false;
      upstream.once('error', () => {
        if (!connected) {
          upstream.destroy();
          if (tries > 1) attempt(tries - 1);
          else client.destroy();
          return;
        }
        client.destroy();
      });
      upstream.once('connect', () => {
        connected = true;
        hits.set(port, (hits.get(port) ?? 0) + 1);
        client.pipe(upstream).pipe(client);
        upstream.on('error', () => client.destroy());
        client.on('close', () => upstream.destroy());
      });
    };
    attempt(ports.length);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const port = (server.address() as net.AddressInfo).port;
  return {
    url: `http://127.0.0.1:${port}`,
    hits,
    close: () =>
      new Promise((r) => {
        for (const s of sockets) s.destroy();
        server.close(() => r());
      }),
  };
}

interface Res {
  status: number;
  body: Record<string, unknown> | undefined;
}

/** One request on a new connection (so the front end picks a replica per request). */
export function call(base: string, method: string, path: string, body?: unknown): Promise<Res> {
  return new Promise((resolve, reject) => {
    const data = body === undefined ? undefined : JSON.stringify(body);
    const req = http.request(
      `${base}${path}`,
      {
        method,
        agent: false,
        timeout: 10_000,
        headers: data
          ? { 'content-type': 'application/json', 'content-length': Buffer.byteLength(data) }
          : {},
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => {
          const text = Buffer.concat(chunks).toString();
          resolve({ status: res.statusCode ?? 0, body: text ? JSON.parse(text) : undefined });
        });
        res.on('error', reject);
      },
    );
    req.on('timeout', () => req.destroy(new Error('timeout')));
    req.on('error', reject);
    req.end(data);
  });
}

/**
 * Short on purpose: a release in the last checkpoint interval before a crash is lost with it,
 * so the lease comes back on the new leader and holds its slot until it expires.
 */
export const LEASE_TTL_SECONDS = 15;

interface HeldLease {
  id: string;
  proxy: string;
  target: string;
  /** Granted before the failover and not yet renewed since: the new leader may not know it. */
  unconfirmed: boolean;
}

export interface LoadStats {
  grants: number;
  refusals: number;
  noLeader: number;
  renewals: number;
  releases: number;
  blockedReports: number;
  errors: number;
  /** The first few request errors, for a failure message. */
  errorSamples: string[];
  violations: string[];
  /** When each `blocked` report was acknowledged: "proxy|target" → ms. */
  blockedAt: Map<string, number>;
  /**
   * Grants after a crash that went against a block acknowledged before it: a violation only if
   * the block was acknowledged before the checkpoint the new leader restored.
   */
  crashWindow: { acked: number; what: string }[];
  /** Grants per ms, for the takeover time: the first grant after a given moment. */
  grantTimes: number[];
}

export interface Load {
  stats: LoadStats;
  /** Marks every lease held now as unconfirmed (call when the leader is killed). */
  failover(at: number): void;
  /** Blocked reports acknowledged before this moment must be honoured (default: all). */
  honourBefore: { at: number; from: number } | undefined;
  stop(): Promise<void>;
}

export interface LoadOptions {
  base: string;
  clients: number;
  namespace: string;
  selector: string;
  maxLeases: number;
  targets: number;
  seed?: number;
}

/** Starts `clients` loops against `base`; stop() waits for them to finish their current step. */
export function startLoad(o: LoadOptions): Load {
  const random = seededRandom(o.seed);
  const stats: LoadStats = {
    grants: 0,
    refusals: 0,
    noLeader: 0,
    renewals: 0,
    releases: 0,
    blockedReports: 0,
    errors: 0,
    errorSamples: [],
    violations: [],
    blockedAt: new Map(),
    crashWindow: [],
    grantTimes: [],
  };
  const held = new Set<HeldLease>();
  let stopped = false;
  const load: Load = {
    stats,
    honourBefore: undefined,
    failover(at) {
      for (const l of held) l.unconfirmed = true;
      // Reports acknowledged within a checkpoint interval of the crash may be lost with it.
      load.honourBefore = { at, from: at };
    },
    async stop() {
      stopped = true;
      await Promise.all(loops);
    },
  };

  const countOn = (proxy: string) => [...held].filter((l) => l.proxy === proxy && !l.unconfirmed).length;
  /** Whether a grant of `key` sent at `sentAt` breaks an acknowledged block; see crashWindow. */
  const breaksBlock = (key: string, sentAt: number, what: string): boolean => {
    const acked = stats.blockedAt.get(key);
    if (acked === undefined || acked >= sentAt) return false;
    const window = load.honourBefore;
    // Acknowledged before a crash: honoured only if the last checkpoint had it, which only the
    // new leader's restore can tell (the test checks these against its `asOf`).
    if (window && acked <= window.at) {
      stats.crashWindow.push({ acked, what });
      return false;
    }
    return true;
  };

  const step = async (): Promise<void> => {
    const target = `site-${Math.floor(random() * o.targets)}.example`;
    const sentAt = Date.now();
    const r = await call(o.base, 'POST', '/v1/leases', {
      namespace: o.namespace,
      selector: o.selector,
      target,
      ttlSeconds: LEASE_TTL_SECONDS,
    });
    if (r.status === 503) {
      stats.noLeader++;
      await new Promise((res) => setTimeout(res, 100));
      return;
    }
    if (r.status === 409) {
      stats.refusals++;
      await new Promise((res) => setTimeout(res, 20));
      return;
    }
    if (r.status !== 201) {
      stats.errors++;
      return;
    }
    const body = r.body as { id: string; proxy: { name: string } };
    // Granted by a leader that crashed right after: the next one may not know it.
    const unconfirmed = load.honourBefore !== undefined && sentAt <= load.honourBefore.at;
    const lease: HeldLease = { id: body.id, proxy: body.proxy.name, target, unconfirmed };
    stats.grants++;
    stats.grantTimes.push(Date.now());
    if (!unconfirmed && countOn(lease.proxy) >= o.maxLeases) {
      stats.violations.push(`${lease.proxy} granted beyond maxLeases ${o.maxLeases}`);
    }
    const what = `${lease.proxy} granted for ${target} after a blocked report`;
    if (breaksBlock(`${lease.proxy}|${target}`, sentAt, what)) stats.violations.push(what);
    held.add(lease);
    await finish(lease);
  };

  /** Renew, then report or release, retrying through a failover. */
  const finish = async (lease: HeldLease): Promise<void> => {
    const renew = await retrying(() =>
      call(o.base, 'POST', `/v1/leases/${lease.id}/renew`, { ttlSeconds: LEASE_TTL_SECONDS }),
    );
    if (renew?.status === 404) {
      // Lost with a crash before it was checkpointed: the leader no longer counts it.
      held.delete(lease);
      return;
    }
    if (renew?.status === 200) {
      stats.renewals++;
      lease.unconfirmed = false;
    }
    const roll = random();
    // The lease ends when the request leaves: the leader may grant the slot away before its
    // answer reaches us.
    held.delete(lease);
    if (roll < 0.15) {
      const r = await retrying(() =>
        call(o.base, 'POST', `/v1/leases/${lease.id}/report`, { result: 'blocked', cooldownSeconds: 3600 }),
      );
      if (r?.status === 200) {
        stats.blockedReports++;
        stats.blockedAt.set(`${lease.proxy}|${lease.target}`, Date.now());
      }
      return;
    }
    const r =
      roll < 0.5
        ? await retrying(() => call(o.base, 'POST', `/v1/leases/${lease.id}/report`, { result: 'success' }))
        : await retrying(() => call(o.base, 'DELETE', `/v1/leases/${lease.id}`));
    if (r && (r.status === 200 || r.status === 204)) stats.releases++;
  };

  const retrying = async (f: () => Promise<Res>): Promise<Res | undefined> => {
    for (let i = 0; i < 200 && !stopped; i++) {
      try {
        const r = await f();
        if (r.status !== 503) return r;
        stats.noLeader++;
      } catch (err) {
        stats.errors++;
        if (stats.errorSamples.length < 5) stats.errorSamples.push(String(err));
      }
      await new Promise((res) => setTimeout(res, 100));
    }
    return undefined;
  };

  const loops = Array.from({ length: o.clients }, async () => {
    while (!stopped) {
      try {
        await step();
      } catch (err) {
        stats.errors++;
        if (stats.errorSamples.length < 5) stats.errorSamples.push(String(err));
        await new Promise((res) => setTimeout(res, 50));
      }
    }
  });
  return load;
}
