/**
 * gateway/link — keeps a replica's gateway (gateway/replica) in step with the leader's hub
 * (gateway/hub) over `POST /v1/internal/gateway/sync` (gateway/share): a sync loop that renews
 * and resizes the replica's capacity share and delivers its reports (every SYNC_INTERVAL_MS,
 * and at once when the replica needs it), and a watch loop whose long poll brings every new
 * cooldown as soon as the leader has it. On the leader itself both call the hub in process.
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

export interface LinkOptions {
  replica: ReplicaChooser;
  hub: GatewayHub;
  authority: LeaseAuthority;
  /** The discovery token the leader's API wants, if any. */
  token: string | undefined;
  /** The HTTP client for the leader (discovery/authority's, which pins the shared certificate). */
  agent: Agent;
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

  private async syncLoop(signal: AbortSignal): Promise<void> {
    while (!signal.aborted) {
      this.kicked = false;
      const share = this.o.replica.shareRequest();
      const ok = await this.exchange(
        {
          replica: this.id,
          epoch: this.epoch,
          cursor: this.cursor,
          waitMs: 0,
          held: share.held,
          want: share.want,
          release: share.release,
          reports: share.reports,
          sessionAnswers: share.sessionAnswers,
        },
        signal,
      );
      if (!ok) this.o.replica.requeue(share.reports, share.sessionAnswers, share.release);
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
        },
        signal,
      );
      if (!ok) await this.pause(RETRY_MS, signal, false);
    }
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
    const d = this.o.authority.decide(false);
    let answer: SyncAnswer;
    try {
      if (d.kind === 'local') answer = await this.o.hub.sync(req);
      else if (d.kind === 'forward') answer = await this.post(d.url, req, signal);
      else return false;
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
    this.o.replica.applyAnswer(answer);
    return true;
  }

  private async post(leader: string, req: SyncRequest, signal: AbortSignal): Promise<SyncAnswer> {
    const headers: Record<string, string> = { 'content-type': 'application/json', [FORWARDED_HEADER]: '1' };
    if (this.o.token !== undefined) headers.authorization = `Bearer ${this.o.token}`;
    const res = await request(new URL(SYNC_PATH, leader), {
      method: 'POST',
      headers,
      body: JSON.stringify(req),
      dispatcher: this.o.agent,
      headersTimeout: req.waitMs + HTTP_TIMEOUT_MS,
      bodyTimeout: HTTP_TIMEOUT_MS,
      signal,
    });
    const text = await res.body.text();
    if (res.statusCode !== 200) throw new Error(`leader answered ${res.statusCode}: ${text.slice(0, 200)}`);
    return JSON.parse(text) as SyncAnswer;
  }
}
