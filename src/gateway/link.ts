/**
 * gateway/link — keeps a replica's gateway (gateway/replica) in step with the leader's hub
 * (gateway/hub) over `POST /v1/internal/gateway/sync` (gateway/share): a sync loop that renews
 * and resizes the replica's capacity share and delivers its reports (every SYNC_INTERVAL_MS,
 * and at once when the replica needs it), and a watch loop whose long poll brings every new
 * cooldown as soon as the leader has it. Syncs go through a transport: to the hub in process on
 * the leader itself, over HTTP elsewhere (leaderTransport), or anything a test wires in. Every
 * answer is checked by the replica before it changes anything (gateway/share).
 */
import { randomBytes } from 'node:crypto';
import { hostname } from 'node:os';
import type { Logger } from 'pino';
import { type Agent, request } from 'undici';
import { FORWARDED_HEADER, type LeaseAuthority } from '../discovery/authority.ts';
import { errorMessage } from '../log/errors.ts';
import type { Clock } from '../runtime/clock.ts';
import type { GatewayHub } from './hub.ts';
import type { ReplicaChooser } from './replica.ts';
import { SYNC_PATH, type SyncAnswer, type SyncRequest } from './share.ts';

/** Shares are renewed and resized this often (slot leases live SLOT_TTL_SECONDS). */
export const SYNC_INTERVAL_MS = 2000;
const WATCH_WAIT_MS = 20_000;
const RETRY_MS = 500;
/** The soonest a replica short of capacity asks again. */
const KICKED_MS = 100;
const HTTP_TIMEOUT_MS = 10_000;

/** Sends one sync to whoever leads; resolves with its answer (unchecked), or undefined when nobody leads now. */
export type SyncTransport = (req: SyncRequest, signal: AbortSignal) => Promise<unknown>;

/** The transport of a real replica: the hub in process while this process leads, else the leader's API. */
export function leaderTransport(o: {
  hub: GatewayHub;
  authority: LeaseAuthority;
  /** The discovery token the leader's API wants, if any. */
  token: string | undefined;
  /** The HTTP client for the leader (discovery/authority's, which pins the shared certificate). */
  agent: Agent;
}): SyncTransport {
  return async (req, signal) => {
    const d = o.authority.decide(false);
    if (d.kind === 'local') return o.hub.sync(req);
    if (d.kind !== 'forward') return undefined;
    const headers: Record<string, string> = { 'content-type': 'application/json', [FORWARDED_HEADER]: '1' };
    if (o.token !== undefined) headers.authorization = `Bearer ${o.token}`;
    const res = await request(new URL(SYNC_PATH, d.url), {
      method: 'POST',
      headers,
      body: JSON.stringify(req),
      dispatcher: o.agent,
      headersTimeout: req.waitMs + HTTP_TIMEOUT_MS,
      bodyTimeout: HTTP_TIMEOUT_MS,
      signal,
    });
    const text = await res.body.text();
    if (res.statusCode !== 200) throw new Error(`leader answered ${res.statusCode}: ${text.slice(0, 200)}`);
    return JSON.parse(text) as unknown;
  };
}

export interface LinkOptions {
  replica: ReplicaChooser;
  transport: SyncTransport;
  clock: Clock;
  log: Logger;
  /** Counts a failed sync (a metric). */
  onFailure?: () => void;
}

export class GatewayLink {
  private readonly o: LinkOptions;
  readonly id = `${hostname().slice(0, 60)}-${randomBytes(6).toString('hex')}`;
  private epoch = '';
  private cursor = 0;
  private kicked = false;
  private wakeSync: (() => void) | undefined;
  private failing = false;

  constructor(o: LinkOptions) {
    this.o = o;
    o.replica.onNeed = () => this.kick();
  }

  /** Runs both loops until `signal` aborts. */
  async run(signal: AbortSignal): Promise<void> {
    await Promise.all([this.syncLoop(signal), this.watchLoop(signal)]);
  }

  private kick(): void {
    this.kicked = true;
    this.wakeSync?.();
  }

  /** One share sync: renews and resizes the share, delivers the reports; false when it failed (they are kept). */
  async syncOnce(signal: AbortSignal): Promise<boolean> {
    const share = this.o.replica.shareRequest();
    const ok = await this.exchange(
      {
        replica: this.id,
        epoch: this.epoch,
        cursor: this.cursor,
        waitMs: 0,
        upstreamCursor: this.upstreamCursor(),
        ...(share.shareToken === undefined ? { held: share.held } : { shareToken: share.shareToken }),
        want: share.want,
        release: share.release,
        reports: share.reports,
        sessionAnswers: share.sessionAnswers,
      },
      signal,
    );
    if (!ok) this.o.replica.requeue(share.reports, share.sessionAnswers, share.release);
    return ok;
  }

  private async syncLoop(signal: AbortSignal): Promise<void> {
    while (!signal.aborted) {
      this.kicked = false;
      const ok = await this.syncOnce(signal);
      if (!ok) await this.pause(RETRY_MS, signal, false);
      else if (this.kicked) await this.pause(KICKED_MS, signal, false);
      else await this.pause(SYNC_INTERVAL_MS, signal, true);
    }
  }

  private async watchLoop(signal: AbortSignal): Promise<void> {
    while (!signal.aborted) {
      const ok = await this.exchange(
        {
          replica: this.id,
          epoch: this.epoch,
          cursor: this.cursor,
          waitMs: WATCH_WAIT_MS,
          askCursor: this.o.replica.askCursor,
          upstreamCursor: this.upstreamCursor(),
        },
        signal,
      );
      if (!ok) await this.pause(RETRY_MS, signal, false);
    }
  }

  /** The replica's upstream cursor when it belongs to the epoch synced with (else 0: send everything). */
  private upstreamCursor(): number {
    const r = this.o.replica;
    return r.upstreamEpoch === this.epoch ? r.upstreamCursor : 0;
  }

  private pause(ms: number, signal: AbortSignal, kickable: boolean): Promise<void> {
    return new Promise((resolve) => {
      const done = () => {
        this.o.clock.clearTimeout(t);
        signal.removeEventListener('abort', done);
        if (kickable) this.wakeSync = undefined;
        resolve();
      };
      const t = this.o.clock.setTimeout(done, ms);
      signal.addEventListener('abort', done, { once: true });
      if (kickable) this.wakeSync = done;
    });
  }

  /** One sync with whoever decides leases now; false when nobody could answer. */
  private async exchange(req: SyncRequest, signal: AbortSignal): Promise<boolean> {
    let answer: SyncAnswer;
    try {
      const raw = await this.o.transport(req, signal);
      if (raw === undefined) return false;
      answer = this.o.replica.applyAnswer(raw);
    } catch (err) {
      if (signal.aborted) return false;
      this.o.onFailure?.();
      if (!this.failing) {
        this.failing = true;
        this.o.log.warn({ err: errorMessage(err) }, 'gateway sync with the leader failed; retrying');
      }
      return false;
    }
    if (this.failing) {
      this.failing = false;
      this.o.log.info('gateway sync with the leader works again');
    }
    if (answer.epoch !== this.epoch) {
      this.epoch = answer.epoch;
      this.cursor = answer.cursor;
    } else this.cursor = Math.max(this.cursor, answer.cursor);
    return true;
  }
}
