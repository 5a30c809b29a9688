/**
 * test/support/gateway/sites — loopback TLS sites for the gateway's HTTPS-inspection tests: one
 * HTTPS server per site, each on its own 127.0.0.x address (a site is a host to the gateway's
 * per-site cooldowns; the addresses are literals, so neither the gateway, the local proxies nor
 * the clients need a name resolved), with a certificate from a throwaway CA (support/pki.ts) whose
 * file the inspecting proxy is told to trust for origins. Each site behaves deterministically:
 * pages `[/<prefix>]/p/<n>` with `n % REFUSE_EVERY === 1` are refused the first time anyone asks for them —
 * `forbid` with 403, `rateLimit` with 429 and `Retry-After: 1`, `captcha` with a 200 whose body is
 * a captcha-like challenge — and answered 200 with `PAGE_MARK` in the body after that; `plain`
 * sites answer 200 always. Every request is logged (site, path, source address, status, whether
 * it was refused), so a test can see which egress address each refusal went to. Every site also
 * accepts a WebSocket at `/ws` (`wss://`) that echoes each message, and one plain-HTTP server on
 * the `plain` site's address does the same over `ws://` (support/websocket-echo.ts).
 */
import { mkdtempSync, writeFileSync } from 'node:fs';
import { createServer as createHttpServer, type IncomingMessage } from 'node:http';
import { createServer, type Server } from 'node:https';
import type { AddressInfo, Server as NetServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Duplex } from 'node:stream';
import { makePki } from '../pki.ts';
import { acceptEcho } from '../websocket-echo.ts';

export type SiteBehaviour = 'forbid' | 'rateLimit' | 'captcha' | 'plain';

/** Every REFUSE_EVERY-th page (n % REFUSE_EVERY === 1) is refused on its first request. */
export const REFUSE_EVERY = 4;
/** In every answered page's body; never in a refusal. */
export const PAGE_MARK = 'page-ok';
/** The captcha-like challenge's text, which a body rule matches. */
export const CAPTCHA_TEXT = 'Please verify you are a human';

export interface SiteSpec {
  name: string;
  /** A loopback address of its own (127.0.0.x). */
  address: string;
  behaviour: SiteBehaviour;
}

export interface Site extends SiteSpec {
  port: number;
  /** `https://<address>:<port>` */
  baseUrl: string;
  /** `<address>:<port>` */
  authority: string;
  /** The URLs of pages 0 … count-1, under `prefix` (`/<prefix>/p/<n>`; each prefix refuses afresh). */
  pages(count: number, prefix?: string): string[];
  /** `wss://<address>:<port>/ws`, an echoing WebSocket. */
  wsUrl: string;
}

export interface SiteLogEntry {
  site: string;
  path: string;
  /** The request's source address: which egress address carried it. */
  source: string;
  status: number;
  /** Whether this answer was a refusal (403, 429 or the captcha page). */
  refused: boolean;
}

export interface Sites {
  sites: Site[];
  byName(name: string): Site;
  log: SiteLogEntry[];
  /** Refusals per site: site name → the source addresses refused, in order. */
  refusals(): Map<string, string[]>;
  /** PEM file of the CA that signed every site's certificate (trust it for origins). */
  originCaFile: string;
  /** The CA's PEM. */
  originCa: string;
  /** `ws://<plain site's address>:<port>/ws`: an echoing WebSocket without TLS (a page at `/`). */
  plainWsUrl: string;
  /** Every site's port and the plain WebSocket's (for egress policies). */
  ports: number[];
  close(): Promise<void>;
}

/** The default set: one site per behaviour, plus a plain one the tests exclude from inspection. */
export const DEFAULT_SITES: SiteSpec[] = [
  { name: 'forbid', address: '127.0.0.31', behaviour: 'forbid' },
  { name: 'ratelimit', address: '127.0.0.32', behaviour: 'rateLimit' },
  { name: 'captcha', address: '127.0.0.33', behaviour: 'captcha' },
  { name: 'plain', address: '127.0.0.34', behaviour: 'plain' },
  { name: 'excluded', address: '127.0.0.35', behaviour: 'plain' },
];

const refuses = (n: number) => n % REFUSE_EVERY === 1;

function listen(server: NetServer, host: string): Promise<number> {
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, host, () => resolve((server.address() as AddressInfo).port));
  });
}

export async function startSites(specs: SiteSpec[] = DEFAULT_SITES): Promise<Sites> {
  const pki = makePki({
    caName: 'sites-test-ca',
    dnsNames: ['localhost'],
    ipAddresses: specs.map((s) => s.address),
    days: 2,
  });
  const dir = mkdtempSync(join(tmpdir(), 'sites-ca-'));
  const originCaFile = join(dir, 'origin-ca.pem');
  writeFileSync(originCaFile, pki.caCert);
  const log: SiteLogEntry[] = [];
  const servers: NetServer[] = [];
  const upgraded = new Set<Duplex>();
  /** A WebSocket opened on `site`: logged with status 101, then echoed. */
  const webSocket = (site: string) => (req: IncomingMessage, socket: Duplex) => {
    const source = (req.socket.remoteAddress ?? '').replace(/^::ffff:/, '');
    log.push({ site, path: req.url ?? '/', source, status: 101, refused: false });
    acceptEcho(req, socket);
  };
  const sites: Site[] = [];
  for (const spec of specs) {
    const asked = new Set<string>();
    const server = createServer({ cert: pki.cert, key: pki.key }, (req, res) => {
      const path = req.url ?? '/';
      const source = (req.socket.remoteAddress ?? '').replace(/^::ffff:/, '');
      const n = Number(/\/p\/(\d+)$/.exec(path)?.[1] ?? -1);
      const first = !asked.has(path);
      asked.add(path);
      const refused = spec.behaviour !== 'plain' && first && refuses(n);
      let status = 200;
      let body = `<html><body>${PAGE_MARK} ${spec.name} ${path}</body></html>`;
      const headers: Record<string, string> = { 'Content-Type': 'text/html', 'X-Peer': source };
      if (refused && spec.behaviour === 'forbid') {
        status = 403;
        body = '<html><body>Forbidden</body></html>';
      } else if (refused && spec.behaviour === 'rateLimit') {
        status = 429;
        headers['Retry-After'] = '1';
        body = '<html><body>Too many requests</body></html>';
      } else if (refused && spec.behaviour === 'captcha') {
        body = `<html><body><form>${CAPTCHA_TEXT}: <input name="captcha"></form></body></html>`;
      }
      log.push({ site: spec.name, path, source, status, refused });
      res.writeHead(status, headers).end(body);
    });
    server.on('upgrade', webSocket(spec.name));
    servers.push(server);
    const port = await listen(server, spec.address);
    const baseUrl = `https://${spec.address}:${port}`;
    sites.push({
      ...spec,
      port,
      baseUrl,
      authority: `${spec.address}:${port}`,
      pages: (count, prefix) =>
        Array.from({ length: count }, (_, n) => `${baseUrl}${prefix ? `/${prefix}` : ''}/p/${n}`),
      wsUrl: `wss://${spec.address}:${port}/ws`,
    });
  }
  const plainAddress = specs.find((s) => s.behaviour === 'plain')?.address ?? '127.0.0.1';
  const plainWs = createHttpServer((_req, res) =>
    res.writeHead(200, { 'Content-Type': 'text/html' }).end(`<html><body>${PAGE_MARK} echo</body></html>`),
  );
  plainWs.on('upgrade', webSocket('plain-ws'));
  servers.push(plainWs);
  const plainWsPort = await listen(plainWs, plainAddress);
  return {
    sites,
    byName: (name) => {
      const s = sites.find((x) => x.name === name);
      if (!s) throw new Error(`no site ${name}`);
      return s;
    },
    log,
    refusals: () => {
      const out = new Map<string, string[]>();
      for (const e of log) if (e.refused) out.set(e.site, [...(out.get(e.site) ?? []), e.source]);
      return out;
    },
    originCaFile,
    originCa: pki.caCert,
    plainWsUrl: `ws://${plainAddress}:${plainWsPort}/ws`,
    ports: [...sites.map((s) => s.port), plainWsPort],
    close: async () => {
      for (const u of upgraded) u.destroy();
      await Promise.all(
        servers.map(
          (s) =>
            new Promise<void>((resolve) => {
              s.close(() => resolve());
              (s as Server).closeAllConnections();
            }),
        ),
      );
    },
  };
}

/** How many of pages 0 … count-1 a refusing site refuses once. */
export function refusedPages(count: number): number {
  return Array.from({ length: count }, (_, n) => n).filter(refuses).length;
}
