/**
 * health/control — the control probes: each distinct probe URL is fetched directly (without a
 * proxy) once per interval, so a dead test URL freezes proxy verdicts instead of failing the
 * whole fleet (see docs/health.md). Runs on the shared slot scheduler; publishes
 * `proxy_operator_healthcheck_target_up`.
 */
import type { Logger } from 'pino';
import type { Gauge } from 'prom-client';
import type { Clock } from '../runtime/clock.ts';
import type { ResolvedCheck } from './policy.ts';
import type { DirectProbeFn, ProbeOptions } from './probe.ts';
import { SlotScheduler } from './scheduler.ts';

export const REASON_TARGET_DOWN = 'TargetDown';

interface Control {
  url: string;
  /** The redacted URL (api/url redactUrl): the one logs and the gauge label show. */
  shownUrl: string;
  expectStatus: number;
  timeoutMs: number;
  intervalMs: number;
  /** Proxies whose check uses this URL and status. */
  users: number;
  /** Last direct result; undefined before the first one. */
  up: boolean | undefined;
  /**
   * Whether a direct fetch ever worked. An operator without direct egress can never reach the
   * URL; freezing on that would hide every dead proxy forever, so freezing needs it once up.
   */
  everUp: boolean;
}

export interface ControlProbesOptions {
  clock: Clock;
  log: Logger;
  probe: DirectProbeFn;
  /** TLS sessions and trust anchors shared with the proxy probes; the signal is added here. */
  probeOptions: Omit<ProbeOptions, 'signal'>;
  targetUp: Gauge<'url'>;
  /** False: no control probes; verdicts never freeze. */
  enabled: boolean;
}

/** The key of the control shared by every check with this URL and expected status. */
export const controlKeyOf = (check: Pick<ResolvedCheck, 'url' | 'expectStatus'>): string =>
  `${check.expectStatus} ${check.url}`;

export class ControlProbes {
  private readonly opts: ControlProbesOptions;
  private readonly controls = new Map<string, Control>();
  private readonly scheduler: SlotScheduler;
  private abort = new AbortController();
  private active = false;

  constructor(opts: ControlProbesOptions) {
    this.opts = opts;
    this.scheduler = new SlotScheduler({
      clock: opts.clock,
      concurrency: Number.POSITIVE_INFINITY,
      run: (key) => this.runControl(key),
      onError: (key, err) =>
        opts.log.error({ err, url: this.controls.get(key)?.shownUrl }, 'control probe crashed'),
    });
  }

  start(): void {
    if (this.active) return;
    this.active = true;
    this.abort = new AbortController();
    this.scheduler.start();
  }

  /** Aborts direct fetches in flight and waits for them to settle. */
  async stop(): Promise<void> {
    if (!this.active) return;
    this.active = false;
    this.abort.abort();
    await this.scheduler.stop();
  }

  /** Registers one more user of `check`'s control; the first starts probing at once. */
  acquire(check: ResolvedCheck): void {
    if (!this.opts.enabled) return;
    const key = controlKeyOf(check);
    const c = this.controls.get(key);
    if (c) {
      c.users++;
      if (check.intervalMs < c.intervalMs) {
        c.intervalMs = check.intervalMs;
        this.scheduler.retime(key, c.intervalMs);
      }
      return;
    }
    this.controls.set(key, {
      url: check.url,
      shownUrl: check.shownUrl,
      expectStatus: check.expectStatus,
      timeoutMs: Math.min(check.timeoutMs, check.intervalMs),
      intervalMs: check.intervalMs,
      users: 1,
      up: undefined,
      everUp: false,
    });
    // Now, then every interval on the same grid.
    this.scheduler.add(key, check.intervalMs, this.opts.clock.now());
  }

  /** Drops one user of the control `key`; the last one stops it and its gauge series. */
  release(key: string): void {
    const c = this.controls.get(key);
    if (!c) return;
    c.users--;
    if (c.users > 0) return;
    this.controls.delete(key);
    this.scheduler.delete(key);
    this.publishTargetUp(c.shownUrl);
  }

  /** True while the URL is down when fetched directly, having worked directly before. */
  frozen(key: string): boolean {
    const c = this.controls.get(key);
    return c?.up === false && c.everUp;
  }

  private async runControl(key: string): Promise<void> {
    const c = this.controls.get(key);
    if (!c) return;
    const check = { url: c.url, expectStatus: c.expectStatus, timeoutMs: c.timeoutMs };
    const r = await this.opts.probe(check, { ...this.opts.probeOptions, signal: this.abort.signal });
    if (!this.active || this.controls.get(key) !== c) return;
    const up = r.ok;
    if (up === c.up) return;
    const log = this.opts.log;
    if (!r.ok && !c.everUp) {
      log.warn(
        { url: c.shownUrl, probeReason: r.reason, message: r.message },
        'health check URL is not reachable directly from the operator; proxy verdicts are not frozen for it until a direct fetch succeeds',
      );
    } else if (!r.ok) {
      log.warn(
        { url: c.shownUrl, reason: REASON_TARGET_DOWN, probeReason: r.reason, message: r.message },
        'health check target is down when fetched directly; proxy verdicts frozen',
      );
    } else if (c.up === false) {
      log.info({ url: c.shownUrl }, 'health check target is reachable again; proxy verdicts resume');
    }
    c.up = up;
    if (up) c.everUp = true;
    this.publishTargetUp(c.shownUrl);
  }

  /** One series per redacted URL: up only when every control of that URL is up. */
  private publishTargetUp(shownUrl: string): void {
    let any = false;
    let up = true;
    for (const c of this.controls.values()) {
      if (c.shownUrl !== shownUrl || c.up === undefined) continue;
      any = true;
      up &&= c.up;
    }
    if (any) this.opts.targetUp.set({ url: shownUrl }, up ? 1 : 0);
    else this.opts.targetUp.remove({ url: shownUrl });
  }
}
