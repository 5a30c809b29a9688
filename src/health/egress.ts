/**
 * health/egress — the optional egress-IP check (SPEC §5, `--egress-ip-url`): every few minutes
 * each addressable proxy fetches a "what is my IP" URL through itself, and the address the
 * origin reports is published in `status.egressIP` (only when it changed, only that field), so
 * duplicate egress IPs and NAT surprises are visible. Leader-only: it writes status.
 * Messages and logs name proxies, hosts and ports only: never credentials.
 */
import { isIP, type Socket, connect as tcpConnect } from 'node:net';
import { type ConnectionOptions, type TLSSocket, connect as tlsConnect } from 'node:tls';
import { Counter, Gauge, Registry } from 'prom-client';
import { keyOf, parseKey } from '../api/meta.ts';
import { type ProxyObject, servingEndpoint } from '../api/proxy.ts';
import { readProxyCredentials } from '../controller/credentials.ts';
import { type Logger, silentLogger } from '../log/index.ts';
import type { Credentials } from '../provider/contract.ts';
import { errorMessage } from '../provider/errors.ts';
import { type Clock, systemClock, type TimerHandle } from '../runtime/clock.ts';
import { isConflict, isNotFound, type ObjectStore } from '../runtime/store.ts';
import { nextSlot, scheduleOffset } from './policy.ts';
import { type ProbeOptions, type ProbeTarget, parseProbeUrl } from './probe.ts';

export const DEFAULT_EGRESS_INTERVAL_MS = 5 * 60_000;
export const DEFAULT_EGRESS_CONCURRENCY = 16;
export const DEFAULT_EGRESS_TIMEOUT_MS = 10_000;
/** Bigger answers are not an IP service: refuse them instead of buffering. */
const MAX_RESPONSE_BYTES = 64 * 1024;
const CONFLICT_RETRIES = 5;
/** The scheduler wakes at most this often, so a big fleet costs O(fleet) per second, not per slot. */
const MIN_TICK_MS = 1000;
const USER_AGENT = 'egress-proxies-operator-egress-ip/1';

export type EgressCheckResult = 'ok' | 'failed' | 'bad_answer';
export const EGRESS_CHECK_RESULTS: readonly EgressCheckResult[] = ['ok', 'failed', 'bad_answer'];

export interface EgressIpCheckerOptions {
  store: ObjectStore;
  /** The "what is my IP" URL (`--egress-ip-url`), http or https. */
  url: string;
  /** Each proxy is checked once per interval, at a stable offset. Default 5 min. */
  intervalMs?: number;
  /** Checks in flight at once, fleet-wide. Default 16. */
  concurrency?: number;
  /** One check, connect to last body byte. Default 10 s. */
  timeoutMs?: number;
  clock?: Clock;
  log?: Logger;
  /** Metrics are registered here; a private registry when omitted. */
  registry?: Registry;
  /** Extra trust anchors for an https URL (tests, private services); system roots otherwise. */
  ca?: ProbeOptions['ca'];
}

/** What one `checkOnce` did, for callers and tests. */
export interface EgressCheckSummary {
  ok: number;
  failed: number;
  badAnswer: number;
  /** Managed proxies without credentials yet. */
  skipped: number;
  /** status.egressIP writes. */
  written: number;
}

/** Validates the options; the error names the field. */
export function validateEgressOptions(o: EgressIpCheckerOptions): void {
  let u: URL;
  try {
    u = new URL(o.url);
  } catch {
    throw new Error('--egress-ip-url: not a valid URL');
  }
  if (u.protocol !== 'http:' && u.protocol !== 'https:') {
    throw new Error(`--egress-ip-url: scheme must be http or https, got ${u.protocol}`);
  }
  const int = (name: string, v: number | undefined, min: number, max: number) => {
    if (v !== undefined && (!Number.isInteger(v) || v < min || v > max)) {
      throw new Error(`egress-ip ${name}: must be an integer in [${min}, ${max}], got ${v}`);
    }
  };
  int('intervalMs', o.intervalMs, 1000, 24 * 3_600_000);
  int('concurrency', o.concurrency, 1, 10_000);
  int('timeoutMs', o.timeoutMs, 1, 3_600_000);
}

/** `::ffff:a.b.c.d` → `a.b.c.d`; IPv6 lower-cased; anything else unchanged. */
function normaliseIp(ip: string): string {
  const m = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(ip);
  if (m && isIP(m[1] as string) === 4) return m[1] as string;
  return isIP(ip) === 6 ? ip.toLowerCase() : ip;
}

/** An IP from a comma list: the last entry is what the service's own edge saw (httpbin /ip). */
function ipFromField(v: unknown): string | undefined {
  if (typeof v !== 'string') return undefined;
  const last = v.split(',').at(-1)?.trim() ?? '';
  return isIP(last) ? normaliseIp(last) : undefined;
}

/**
 * The egress IP in a "what is my IP" answer: a plain-text address (`203.0.113.7\n`, ipify,
 * ifconfig.me) or JSON with `ip`, `origin` or `address` (ipify `?format=json`, httpbin `/ip`).
 * Undefined for anything else.
 */
export function parseEgressAnswer(body: string): string | undefined {
  const text = body.trim();
  if (text.startsWith('{')) {
    let doc: unknown;
    try {
      doc = JSON.parse(text);
    } catch {
      return undefined;
    }
    if (!doc || typeof doc !== 'object') return undefined;
    const o = doc as Record<string, unknown>;
    return ipFromField(o.ip) ?? ipFromField(o.origin) ?? ipFromField(o.address);
  }
  return isIP(text) ? normaliseIp(text) : undefined;
}

/**
 * Number of proxies whose egress IP is shared with at least one other proxy.
 * `ips` maps a proxy key to its egress IP.
 */
export function countDuplicates(ips: Iterable<string>): number {
  const counts = new Map<string, number>();
  for (const ip of ips) counts.set(ip, (counts.get(ip) ?? 0) + 1);
  let n = 0;
  for (const c of counts.values()) if (c > 1) n += c;
  return n;
}

export class EgressFetchError extends Error {
  readonly status: number | undefined;
  constructor(message: string, status?: number) {
    super(message);
    this.name = 'EgressFetchError';
    this.status = status;
  }
}

interface Head {
  status: number;
  headers: Map<string, string>;
}

function parseHead(text: string): Head | undefined {
  const lines = text.split('\r\n');
  const m = /^HTTP\/1\.[01] (\d{3})/.exec(lines[0] ?? '');
  if (!m) return undefined;
  const headers = new Map<string, string>();
  for (const line of lines.slice(1)) {
    const i = line.indexOf(':');
    if (i > 0) headers.set(line.slice(0, i).trim().toLowerCase(), line.slice(i + 1).trim());
  }
  return { status: Number(m[1]), headers };
}

/** Decodes a chunked body: the body when complete, undefined while incomplete; throws if malformed. */
function decodeChunked(buf: Buffer): Buffer | undefined {
  const parts: Buffer[] = [];
  let pos = 0;
  for (;;) {
    const eol = buf.indexOf('\r\n', pos);
    if (eol < 0) return undefined;
    const size = Number.parseInt(buf.subarray(pos, eol).toString('latin1').split(';')[0] ?? '', 16);
    if (!Number.isFinite(size) || size < 0) throw new EgressFetchError('malformed chunked response');
    if (size === 0) return Buffer.concat(parts);
    const start = eol + 2;
    if (buf.length < start + size + 2) return undefined;
    parts.push(buf.subarray(start, start + size));
    pos = start + size + 2;
  }
}

/**
 * Reads one response from a socket. `headOnly` (CONNECT) stops after the head and pushes any
 * further bytes back for the TLS layer; otherwise the body is read by Content-Length, chunked
 * encoding or until the peer closes (we always send `Connection: close`).
 */
function readResponse(
  socket: Socket,
  what: string,
  headOnly: boolean,
): Promise<{ status: number; body: Buffer }> {
  return new Promise((resolve, reject) => {
    let buf = Buffer.alloc(0);
    let head: Head | undefined;
    let bodyStart = 0;
    const cleanup = () => {
      socket.off('data', onData);
      socket.off('end', onEnd);
      socket.off('close', onEnd);
      socket.off('error', onError);
    };
    const finish = (body: Buffer) => {
      cleanup();
      resolve({ status: (head as Head).status, body });
    };
    const fail = (err: Error) => {
      cleanup();
      reject(err);
    };
    const tryComplete = (): boolean => {
      if (!head) {
        const end = buf.indexOf('\r\n\r\n');
        if (end < 0) {
          if (buf.length > MAX_RESPONSE_BYTES)
            fail(new EgressFetchError(`${what}: response headers too large`));
          return false;
        }
        head = parseHead(buf.subarray(0, end).toString('latin1'));
        if (!head) {
          fail(new EgressFetchError(`${what}: malformed HTTP response`));
          return false;
        }
        bodyStart = end + 4;
        if (headOnly) {
          socket.pause();
          const rest = buf.subarray(bodyStart);
          cleanup();
          if (rest.length > 0) socket.unshift(rest);
          resolve({ status: head.status, body: Buffer.alloc(0) });
          return true;
        }
      }
      const body = buf.subarray(bodyStart);
      if (body.length > MAX_RESPONSE_BYTES) {
        fail(new EgressFetchError(`${what}: answer larger than ${MAX_RESPONSE_BYTES} bytes`));
        return false;
      }
      if (/\bchunked\b/i.test(head.headers.get('transfer-encoding') ?? '')) {
        try {
          const decoded = decodeChunked(body);
          if (decoded) finish(decoded);
          return decoded !== undefined;
        } catch (err) {
          fail(err as Error);
          return false;
        }
      }
      const cl = head.headers.get('content-length');
      if (cl !== undefined) {
        const n = Number(cl);
        if (!Number.isInteger(n) || n < 0) {
          fail(new EgressFetchError(`${what}: bad Content-Length`));
          return false;
        }
        if (body.length >= n) {
          finish(body.subarray(0, n));
          return true;
        }
      }
      return false;
    };
    const onData = (chunk: Buffer) => {
      buf = Buffer.concat([buf, chunk]);
      tryComplete();
    };
    const onEnd = () => {
      if (head && !headOnly && head.headers.get('content-length') === undefined) {
        if (!/\bchunked\b/i.test(head.headers.get('transfer-encoding') ?? '')) {
          finish(buf.subarray(bodyStart));
          return;
        }
      }
      fail(new EgressFetchError(`${what}: connection closed before a complete response`));
    };
    const onError = (err: NodeJS.ErrnoException) =>
      fail(new EgressFetchError(`${what}: ${err.code ?? err.message}`));
    socket.on('data', onData);
    socket.once('end', onEnd);
    socket.once('close', onEnd);
    socket.once('error', onError);
    socket.resume();
  });
}

function basicAuth(creds: { username: string; password: string }): string {
  return `Basic ${Buffer.from(`${creds.username}:${creds.password}`, 'utf8').toString('base64')}`;
}

const ignore = (): void => undefined;

/**
 * GETs `url` through the forward proxy at `target` and returns status and body: a CONNECT
 * tunnel + verified TLS for https, an absolute-form request for http. Bounded by `timeoutMs`
 * and `signal`; every socket it opened is destroyed when it settles. Throws EgressFetchError
 * (never naming credentials) for anything but a complete response.
 */
export async function fetchThroughProxy(
  target: ProbeTarget,
  url: string,
  opts: { timeoutMs: number; signal?: AbortSignal; ca?: ProbeOptions['ca'] },
): Promise<{ status: number; body: string }> {
  const u = parseProbeUrl(url);
  const proxyName = `${isIP(target.host) === 6 ? `[${target.host}]` : target.host}:${target.port}`;
  const proxyAuth = target.credentials ? basicAuth(target.credentials) : undefined;
  const sockets: Socket[] = [];
  let timer: NodeJS.Timeout | undefined;
  let onAbort: (() => void) | undefined;
  const stop = new Promise<never>((_, reject) => {
    timer = setTimeout(
      () => reject(new EgressFetchError(`no answer within ${opts.timeoutMs} ms`)),
      opts.timeoutMs,
    );
    if (opts.signal) {
      onAbort = () => reject(new EgressFetchError('aborted'));
      if (opts.signal.aborted) onAbort();
      else opts.signal.addEventListener('abort', onAbort, { once: true });
    }
  });
  stop.catch(ignore);

  const work = (async () => {
    const raw = await new Promise<Socket>((resolve, reject) => {
      const s = tcpConnect({ host: target.host, port: target.port, noDelay: true });
      sockets.push(s);
      s.on('error', ignore); // late errors after settling must not crash the process
      const onError = (err: NodeJS.ErrnoException) =>
        reject(new EgressFetchError(`connect to proxy ${proxyName} failed: ${err.code ?? err.message}`));
      s.once('error', onError);
      s.once('connect', () => {
        s.off('error', onError);
        resolve(s);
      });
    });
    let socket: Socket = raw;
    let req = `GET ${u.https ? u.path : u.href} HTTP/1.1\r\nHost: ${u.authority}\r\nUser-Agent: ${USER_AGENT}\r\nAccept: text/plain, application/json;q=0.9, */*;q=0.5\r\nConnection: close\r\n`;
    if (u.https) {
      let connect = `CONNECT ${u.authority} HTTP/1.1\r\nHost: ${u.authority}\r\nUser-Agent: ${USER_AGENT}\r\n`;
      if (proxyAuth) connect += `Proxy-Authorization: ${proxyAuth}\r\n`;
      raw.write(`${connect}\r\n`);
      const { status } = await readResponse(raw, `proxy ${proxyName} CONNECT`, true);
      if (status < 200 || status > 299) {
        throw new EgressFetchError(
          `proxy ${proxyName} answered CONNECT ${u.authority} with ${status}`,
          status,
        );
      }
      const options: ConnectionOptions = {
        socket: raw,
        host: u.host,
        servername: isIP(u.host) ? undefined : u.host,
        ALPNProtocols: ['http/1.1'],
      };
      if (opts.ca !== undefined) options.ca = opts.ca;
      socket = await new Promise<TLSSocket>((resolve, reject) => {
        const s = tlsConnect(options);
        sockets.push(s);
        s.on('error', ignore);
        const onError = (err: NodeJS.ErrnoException) =>
          reject(new EgressFetchError(`TLS with ${u.authority} failed: ${err.code ?? err.message}`));
        s.once('error', onError);
        s.once('secureConnect', () => {
          s.off('error', onError);
          resolve(s);
        });
      });
    } else if (proxyAuth) {
      req += `Proxy-Authorization: ${proxyAuth}\r\n`;
    }
    socket.write(`${req}\r\n`);
    const { status, body } = await readResponse(socket, `GET ${u.href} via ${proxyName}`, false);
    return { status, body: body.toString('utf8') };
  })();
  try {
    return await Promise.race([work, stop]);
  } catch (err) {
    work.catch(ignore);
    if (err instanceof EgressFetchError) throw err;
    throw new EgressFetchError(`GET ${u.href} via ${proxyName} failed: ${errorMessage(err)}`);
  } finally {
    clearTimeout(timer);
    if (onAbort) opts.signal?.removeEventListener('abort', onAbort);
    for (const s of sockets) s.destroy();
  }
}

type CheckOutcome = EgressCheckResult | 'written' | 'skipped';

/** Per-proxy memory between checks (keyed by `namespace/name`). */
interface TargetState {
  uid: string;
  /** When the next check is due (clock ms), and the address the last one went to. */
  due: number;
  checkedAddress: string;
  /** Last IP seen by this process, and the last one logged about (change / duplicate). */
  ip?: string;
  announced?: string;
  /** Last outcome, so a failing proxy warns once, not every interval. */
  lastResult?: EgressCheckResult;
  inFlight: boolean;
}

/** A tiny FIFO semaphore: the fleet-wide concurrency cap. */
class Limiter {
  private active = 0;
  private readonly waiting: Array<() => void> = [];
  private readonly max: number;
  constructor(max: number) {
    this.max = max;
  }
  async run<T>(fn: () => Promise<T>): Promise<T> {
    if (this.active >= this.max) await new Promise<void>((r) => this.waiting.push(r));
    else this.active++;
    try {
      return await fn();
    } finally {
      const next = this.waiting.shift();
      if (next) next();
      else this.active--;
    }
  }
}

/**
 * The scheduler's sleep on the injected clock: `sleepUntil` waits for a time, `kick` brings the
 * wake-up forward (a proxy appeared or moved), but never earlier than `floor` (rate limit).
 */
class Alarm {
  private readonly clock: Clock;
  private handle: TimerHandle | undefined;
  private wakeAt = Number.POSITIVE_INFINITY;
  private floor = 0;
  private resolve: (() => void) | undefined;
  private kicked = false;

  constructor(clock: Clock) {
    this.clock = clock;
  }

  sleepUntil(at: number, floor: number, signal: AbortSignal): Promise<void> {
    this.floor = floor;
    return new Promise((resolve) => {
      if (signal.aborted) return resolve();
      const done = () => {
        if (this.handle) this.clock.clearTimeout(this.handle);
        this.handle = undefined;
        this.resolve = undefined;
        this.wakeAt = Number.POSITIVE_INFINITY;
        signal.removeEventListener('abort', done);
        resolve();
      };
      this.resolve = done;
      signal.addEventListener('abort', done, { once: true });
      this.arm(this.kicked ? Math.min(at, floor) : at);
      this.kicked = false;
    });
  }

  kick(): void {
    if (!this.resolve) {
      this.kicked = true;
      return;
    }
    this.arm(this.floor);
  }

  private arm(at: number): void {
    const when = Math.max(at, this.floor);
    if (when >= this.wakeAt || !this.resolve) return;
    if (this.handle) this.clock.clearTimeout(this.handle);
    this.wakeAt = when;
    const fire = this.resolve;
    this.handle = this.clock.setTimeout(fire, Math.max(0, when - this.clock.now()));
  }
}

/** Where a proxy is checked: a change means a new instance with a possibly new egress IP. */
function addressKey(p: ProxyObject | undefined): string | undefined {
  const a = p ? servingEndpoint(p) : undefined;
  return a ? `${a.host}:${a.port}` : undefined;
}

export class EgressIpChecker {
  private readonly store: ObjectStore;
  private readonly url: string;
  private readonly intervalMs: number;
  private readonly timeoutMs: number;
  private readonly clock: Clock;
  private readonly log: Logger;
  private readonly ca: ProbeOptions['ca'];
  private readonly limiter: Limiter;
  private readonly checks: Counter<'result'>;
  private readonly states = new Map<string, TargetState>();
  private pending = 0;
  /** Redacted URL (no userinfo) for logs. */
  private readonly urlForLogs: string;

  constructor(opts: EgressIpCheckerOptions) {
    validateEgressOptions(opts);
    this.store = opts.store;
    this.url = opts.url;
    this.urlForLogs = parseProbeUrl(opts.url).href;
    this.intervalMs = opts.intervalMs ?? DEFAULT_EGRESS_INTERVAL_MS;
    this.timeoutMs = opts.timeoutMs ?? DEFAULT_EGRESS_TIMEOUT_MS;
    this.clock = opts.clock ?? systemClock;
    this.log = opts.log ?? silentLogger();
    this.ca = opts.ca;
    this.limiter = new Limiter(opts.concurrency ?? DEFAULT_EGRESS_CONCURRENCY);
    const registry = opts.registry ?? new Registry();
    this.checks = new Counter({
      name: 'proxy_operator_egress_ip_checks_total',
      help: 'Egress-IP checks through proxies, by result (ok, failed, bad_answer).',
      labelNames: ['result'],
      registers: [registry],
    });
    for (const r of EGRESS_CHECK_RESULTS) this.checks.inc({ result: r }, 0);
    const store = this.store;
    new Gauge({
      name: 'proxy_operator_egress_ip_duplicates',
      help: 'Addressable proxies whose published egress IP is shared with another proxy.',
      registers: [registry],
      collect() {
        const ips: string[] = [];
        for (const p of store.proxies.list()) {
          const ip = p.status?.egressIP;
          if (ip && servingEndpoint(p)) ips.push(ip);
        }
        this.set(countDuplicates(ips));
      },
    });
  }

  /** Checks scheduled or running right now. */
  get inFlight(): number {
    return this.pending;
  }

  /** Manager runnable body: checks every addressable proxy once per interval until `signal` aborts. */
  async run(signal: AbortSignal): Promise<void> {
    await this.store.proxies.synced(signal).catch(ignore);
    this.log.info({ url: this.urlForLogs, intervalMs: this.intervalMs }, 'egress-IP check started');
    const running = new Set<Promise<unknown>>();
    const alarm = new Alarm(this.clock);
    // New proxies and replaced instances are picked up without waiting for the next slot.
    const unwatch = this.store.proxies.watch((ev) => {
      if (ev.type !== 'DELETED' && addressKey(ev.object) !== addressKey(ev.old)) alarm.kick();
    });
    try {
      await this.loop(signal, alarm, running);
    } finally {
      unwatch();
      await Promise.allSettled(running);
    }
  }

  private async loop(signal: AbortSignal, alarm: Alarm, running: Set<Promise<unknown>>): Promise<void> {
    while (!signal.aborted) {
      const now = this.clock.now();
      let wake = now + this.intervalMs;
      const seen = new Set<string>();
      for (const proxy of this.store.proxies.list()) {
        const key = keyOf(proxy);
        // Kept while the proxy exists at all, so an instance that comes back elsewhere after a
        // replacement is noticed as moved.
        seen.add(key);
        const address = addressKey(proxy);
        if (!address) continue;
        const uid = proxy.metadata.uid ?? '';
        const offset = scheduleOffset(uid, this.intervalMs);
        let state = this.states.get(key);
        if (!state || state.uid !== uid) {
          // Nothing published yet: check now; otherwise at the proxy's slot.
          const due = proxy.status?.egressIP ? nextSlot(now, offset, this.intervalMs) : now;
          state = { uid, due, checkedAddress: address, inFlight: false };
          this.states.set(key, state);
        }
        // A replaced instance (new address) is checked at once: its published IP is stale.
        if (state.checkedAddress !== address) state.due = now;
        if (state.due > now || state.inFlight) {
          wake = Math.min(wake, state.inFlight ? now + MIN_TICK_MS : state.due);
          continue;
        }
        state.due = nextSlot(now + 1, offset, this.intervalMs);
        state.checkedAddress = address;
        state.inFlight = true;
        const current = state;
        const p = this.schedule(key, uid, signal).finally(() => {
          current.inFlight = false;
          running.delete(p);
        });
        running.add(p);
      }
      for (const key of this.states.keys()) if (!seen.has(key)) this.states.delete(key);
      await alarm.sleepUntil(Math.max(wake, now + MIN_TICK_MS), now + MIN_TICK_MS, signal);
    }
  }

  /** Checks every addressable proxy now (concurrency-capped) and resolves when all are done. */
  async checkOnce(signal: AbortSignal): Promise<EgressCheckSummary> {
    const summary: EgressCheckSummary = { ok: 0, failed: 0, badAnswer: 0, skipped: 0, written: 0 };
    const jobs: Promise<void>[] = [];
    for (const proxy of this.store.proxies.list()) {
      if (!servingEndpoint(proxy)) continue;
      const key = keyOf(proxy);
      const uid = proxy.metadata.uid ?? '';
      jobs.push(
        this.schedule(key, uid, signal).then((r) => {
          if (r === 'skipped') summary.skipped++;
          else if (r === 'ok' || r === 'written') summary.ok++;
          else if (r === 'failed') summary.failed++;
          else summary.badAnswer++;
          if (r === 'written') summary.written++;
        }),
      );
    }
    await Promise.all(jobs);
    return summary;
  }

  /** One capped check; never rejects (failures are counted and logged inside). */
  private schedule(key: string, uid: string, signal: AbortSignal): Promise<CheckOutcome> {
    this.pending++;
    return this.limiter
      .run(() => this.checkKey(key, uid, signal))
      .catch((err): CheckOutcome => {
        if (!signal.aborted) this.log.warn({ proxy: key, err: errorMessage(err) }, 'egress-IP check failed');
        return 'failed';
      })
      .finally(() => {
        this.pending--;
      });
  }

  private stateFor(key: string, uid: string): TargetState {
    let s = this.states.get(key);
    if (!s || s.uid !== uid) {
      s = { uid, due: this.clock.now(), checkedAddress: '', inFlight: false };
      this.states.set(key, s);
    }
    return s;
  }

  /** One check of one proxy, read fresh from the cache (it may have changed since listing). */
  private async checkKey(key: string, uid: string, signal: AbortSignal): Promise<CheckOutcome> {
    const proxy = this.store.proxies.get(parseKey(key));
    if (!proxy || (proxy.metadata.uid ?? '') !== uid) return 'skipped';
    const addr = servingEndpoint(proxy);
    if (!addr) return 'skipped';
    const state = this.stateFor(key, uid);
    let credentials: Credentials | undefined;
    try {
      credentials = await readProxyCredentials(this.store.secrets, proxy, signal);
    } catch (err) {
      if (signal.aborted) return 'skipped';
      this.record(key, state, 'failed', `reading credentials failed: ${errorMessage(err)}`);
      return 'failed';
    }
    if (!credentials && (proxy.spec.type ?? 'Managed') === 'Managed') {
      this.log.debug({ proxy: key }, 'egress-IP check skipped: no credentials yet');
      return 'skipped';
    }
    let ip: string | undefined;
    try {
      const res = await fetchThroughProxy(
        { host: addr.host, port: addr.port, ...(credentials ? { credentials } : {}) },
        this.url,
        { timeoutMs: this.timeoutMs, signal, ...(this.ca === undefined ? {} : { ca: this.ca }) },
      );
      if (res.status < 200 || res.status > 299) {
        throw new EgressFetchError(`${this.urlForLogs} answered ${res.status}`, res.status);
      }
      ip = parseEgressAnswer(res.body);
    } catch (err) {
      if (signal.aborted) return 'skipped';
      this.record(key, state, 'failed', errorMessage(err));
      return 'failed';
    }
    if (!ip) {
      this.record(key, state, 'bad_answer', `${this.urlForLogs} did not answer with an IP address`);
      return 'bad_answer';
    }
    this.record(key, state, 'ok');
    const previous = state.ip ?? proxy.status?.egressIP;
    state.ip = ip;
    let written = false;
    try {
      written = await this.publish(key, uid, ip, signal);
    } catch (err) {
      // Not remembered as published: the next check compares with status and writes again.
      if (!signal.aborted)
        this.log.warn({ proxy: key, err: errorMessage(err) }, 'writing status.egressIP failed');
      state.ip = previous;
      return 'ok';
    }
    if (state.announced !== ip) {
      if (previous !== ip) {
        this.log.info({ proxy: key, egressIP: ip, previous: previous ?? null }, 'proxy egress IP changed');
      }
      const sharedWith = this.sharers(key, ip);
      if (sharedWith.length > 0) {
        this.log.warn(
          { proxy: key, egressIP: ip, sharedWith },
          'egress IP shared with other proxies: they are not independent exits',
        );
      }
      state.announced = ip;
    }
    return written ? 'written' : 'ok';
  }

  private record(key: string, state: TargetState, result: EgressCheckResult, message?: string): void {
    this.checks.inc({ result });
    if (result !== 'ok') {
      // Once per run of failures: a dead proxy is already reported by the health engine.
      const level = state.lastResult === result ? 'debug' : 'warn';
      this.log[level]({ proxy: key, result, err: message }, 'egress-IP check did not yield an IP');
    }
    state.lastResult = result;
  }

  /** Other addressable proxies currently known with `ip` (this process's view first). */
  private sharers(key: string, ip: string): string[] {
    const out: string[] = [];
    for (const p of this.store.proxies.list()) {
      const k = keyOf(p);
      if (k === key || !servingEndpoint(p)) continue;
      const s = this.states.get(k);
      const theirs = s && s.uid === (p.metadata.uid ?? '') && s.ip ? s.ip : p.status?.egressIP;
      if (theirs === ip) out.push(k);
    }
    return out.sort();
  }

  /**
   * Writes status.egressIP when it differs, guarded by resourceVersion so no other status
   * field is clobbered; a Conflict re-reads and retries. Returns whether it wrote.
   */
  private async publish(key: string, uid: string, ip: string, signal: AbortSignal): Promise<boolean> {
    const objKey = parseKey(key);
    let obj: ProxyObject | undefined = this.store.proxies.get(objKey);
    for (let attempt = 0; attempt <= CONFLICT_RETRIES; attempt++) {
      if (!obj || (obj.metadata.uid ?? '') !== uid || obj.metadata.deletionTimestamp) return false;
      if (obj.status?.egressIP === ip) return false;
      try {
        const rv = obj.metadata.resourceVersion;
        await this.store.proxies.patchStatus(
          objKey,
          { egressIP: ip },
          { signal, ...(rv === undefined ? {} : { resourceVersion: rv }) },
        );
        return true;
      } catch (err) {
        if (isNotFound(err)) return false;
        if (!isConflict(err)) throw err;
        try {
          obj = await this.store.proxies.read(objKey, { signal });
        } catch (readErr) {
          if (isNotFound(readErr)) return false;
          throw readErr;
        }
      }
    }
    this.log.warn({ proxy: key }, 'egress IP not written: the object kept changing (conflicts)');
    return false;
  }
}
