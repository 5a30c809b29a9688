/**
 * discovery/authority — makes every replica's discovery API behave like the leader's: the
 * leader (once its lease state is restored) answers `/v1/*` itself, a standby forwards the
 * request to the leader's published address, and while no leader is known — or the leader is
 * still restoring or already stepping down — the answer is 503 `no_leader` with `Retry-After: 1`.
 * Lease decisions are therefore made in one process only (docs/lease-api.md, docs/deployment.md).
 */
import { X509Certificate } from 'node:crypto';
import { rootCertificates } from 'node:tls';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { Logger } from 'pino';
import { Agent, request } from 'undici';
import type { TlsFiles } from '../metrics/listener.ts';
import { errorBody } from './errors.ts';

/** Set on a forwarded request: a replica that is not the leader either never forwards it again. */
export const FORWARDED_HEADER = 'x-egress-proxies-forwarded';
const FORWARD_TIMEOUT_MS = 10_000;
/** Response headers a forwarded answer keeps. */
const KEPT_HEADERS = ['content-type', 'cache-control', 'retry-after'];
/** Request headers a forwarded request keeps (Host too, so the leader's Host check sees the client's). */
const SENT_HEADERS = ['authorization', 'content-type', 'accept', 'traceparent', 'tracestate', 'host'];

export type Decision = { kind: 'local' } | { kind: 'forward'; url: string } | { kind: 'none'; why: string };

/** Who answers lease requests right now; shared by the discovery server and the leader-only runnable. */
export class LeaseAuthority {
  private serving = false;
  private readonly leaderUrl: () => string | undefined;
  private readonly isLeader: () => boolean;

  constructor(o: { leaderUrl: () => string | undefined; isLeader: () => boolean }) {
    this.leaderUrl = o.leaderUrl;
    this.isLeader = o.isLeader;
  }

  /** The leader has restored its lease state: from now on it decides. */
  startServing(): void {
    this.serving = true;
  }

  /** Stepping down: nothing is decided here any more (the final checkpoint is being written). */
  stopServing(): void {
    this.serving = false;
  }

  get isServing(): boolean {
    return this.serving;
  }

  decide(forwarded: boolean): Decision {
    if (this.serving) return { kind: 'local' };
    if (this.isLeader())
      return { kind: 'none', why: 'the leader is restoring or handing over its lease state' };
    if (forwarded) return { kind: 'none', why: 'this replica is not the leader' };
    const url = this.leaderUrl();
    return url ? { kind: 'forward', url } : { kind: 'none', why: 'no leader is known' };
  }
}

function noLeader(reply: FastifyReply, why: string): FastifyReply {
  return reply
    .code(503)
    .header('retry-after', '1')
    .header('cache-control', 'no-store')
    .send(errorBody('no_leader', `lease decisions are unavailable: ${why}; retry shortly`));
}

/** The forwarding client: replicas share one certificate, so with TLS the leader must present it. */
export function forwardingAgent(tls: TlsFiles | undefined): Agent {
  if (!tls) return new Agent({ keepAliveTimeout: 30_000, connections: 64 });
  const own = new X509Certificate(tls.cert).fingerprint256;
  return new Agent({
    keepAliveTimeout: 30_000,
    connections: 64,
    connect: {
      ca: [...rootCertificates, tls.cert],
      // The leader is addressed by IP, which a shared certificate rarely names: the pin on our
      // own certificate is the identity check.
      checkServerIdentity: (_host, cert) =>
        cert.fingerprint256 === own ? undefined : new Error('the leader does not present this certificate'),
    },
  });
}

/**
 * Installs the decision in front of every `/v1/*` handler (after auth and validation, so a
 * standby refuses what the leader would refuse, without a round trip).
 */
export function installAuthority(
  app: FastifyInstance,
  authority: LeaseAuthority,
  opts: { log: Logger; tls?: TlsFiles },
): void {
  const agent = forwardingAgent(opts.tls);
  app.addHook('onClose', async () => {
    await agent.close();
  });
  // Callback style: the leader's own requests, nearly all of them, pass without a promise.
  app.addHook('preHandler', (req: FastifyRequest, reply: FastifyReply, done: () => void) => {
    if (!req.url.startsWith('/v1/')) return done();
    const d = authority.decide(req.headers[FORWARDED_HEADER] !== undefined);
    if (d.kind === 'local') return done();
    if (d.kind === 'none') noLeader(reply, d.why);
    else void forward(req, reply, d.url, agent, opts.log);
  });
}

async function forward(
  req: FastifyRequest,
  reply: FastifyReply,
  leader: string,
  agent: Agent,
  log: Logger,
): Promise<FastifyReply> {
  const headers: Record<string, string> = { [FORWARDED_HEADER]: '1' };
  for (const h of SENT_HEADERS) {
    const v = req.headers[h];
    if (typeof v === 'string') headers[h] = v;
  }
  const hasBody = req.body !== undefined && req.method !== 'GET' && req.method !== 'DELETE';
  try {
    const res = await request(new URL(req.url, leader), {
      method: req.method as 'GET' | 'POST' | 'DELETE',
      headers,
      body: hasBody ? JSON.stringify(req.body) : undefined,
      dispatcher: agent,
      headersTimeout: FORWARD_TIMEOUT_MS,
      bodyTimeout: FORWARD_TIMEOUT_MS,
    });
    const body = Buffer.from(await res.body.arrayBuffer());
    reply.code(res.statusCode);
    for (const h of KEPT_HEADERS) {
      const v = res.headers[h];
      if (typeof v === 'string') reply.header(h, v);
    }
    // Sent as is: the leader already serialised it with the same schemas.
    return reply
      .serializer((p: unknown) => p as string)
      .send(body.length ? body.toString('utf8') : undefined);
  } catch (err) {
    log.warn({ err, leader }, 'forwarding to the leader failed');
    return noLeader(reply, 'the leader is not reachable');
  }
}
