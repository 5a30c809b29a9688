/**
 * runtime/manager — starts and stops the operator's long-running pieces in controller-runtime
 * order: caches (until synced) → always-on runnables → leader election → leader-only runnables
 * once leading. Serves /healthz and /readyz, and shuts down gracefully on SIGTERM/SIGINT:
 * stop intake, let runnables drain within a grace period, release the leader lease, stop caches.
 * Signals within a short window of the first are that one stop (a terminal's Ctrl-C and the copy
 * `npm start` forwards); a later one exits at once.
 * The probe port runs on the shared hardened listener (src/metrics/listener.ts): header, request
 * and idle timeouts and a small connection cap (docs/operations.md, "Listeners").
 */
import type { IncomingMessage, Server, ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { errorMessage } from '../log/errors.ts';
import { type Logger, silentLogger } from '../log/index.ts';
import { type BindAddress, parseBindAddress } from '../metrics/bind.ts';
import {
  createListener,
  DEFAULT_HEALTH_PROBE_MAX_CONNECTIONS,
  DEFAULT_LISTENER_TIMEOUTS,
  type ListenerLimits,
  limitsProblem,
} from '../metrics/listener.ts';
import { type Clock, systemClock, type TimerHandle, timeoutSignal } from './clock.ts';
import { LeaderElectionLost, type LeaderElector, StandaloneElector } from './leader/elector.ts';
import type { ObjectStore } from './store.ts';

export interface Runnable {
  name: string;
  /** true: runs only while this replica leads (cloud side effects, the orphan sweep, monitors). */
  needLeaderElection: boolean;
  /**
   * Runs until `signal` aborts, then finishes in-flight work and resolves. A rejection before
   * the manager stops is fatal: the manager shuts down and reports it.
   */
  start(signal: AbortSignal): Promise<void>;
}

/**
 * A health/readiness check: resolve (or return) to pass, throw to fail with a reason. A string
 * it returns passes with a note, shown by `?verbose`: something to fix that does not warrant
 * taking the replica out of service.
 */
export type HealthCheck = () => undefined | string | Promise<undefined | string> | void | Promise<void>;

export interface ManagerOptions {
  /** Caches to start and wait for before anything else runs. */
  store?: Pick<ObjectStore, 'start' | 'stop' | 'proxies' | 'providerHealths' | 'secrets'> &
    Partial<Pick<ObjectStore, 'proxyPools'>>;
  /** Default: a StandaloneElector (leads at once). */
  elector?: LeaderElector;
  /** `host:port`, `:port` or `[v6]:port` for /healthz and /readyz; `0`/empty disables. */
  healthProbeBindAddress?: string;
  /**
   * Timeouts and connection cap of the probe listener. Default: the listener timeouts of
   * src/metrics/listener.ts and `DEFAULT_HEALTH_PROBE_MAX_CONNECTIONS`.
   */
  healthProbeLimits?: ListenerLimits;
  /** How long runnables get to drain on stop (default 30 s). */
  gracePeriodMs?: number;
  /** Give up when caches have not synced by then (default 2 min). */
  cacheSyncTimeoutMs?: number;
  log?: Logger;
  /** Times the grace period, the cache-sync timeout and the signal window (default: the system clock). */
  clock?: Clock;
  /**
   * Signals arriving within this long of the first one count as that one (default 1 s). A
   * terminal's Ctrl-C reaches every process of the foreground group, and `npm start` forwards its
   * own copy to the operator: one keypress arrives twice, milliseconds apart.
   */
  signalWindowMs?: number;
  /** How a signal after the window ends the process at once (default `process.exit`; tests observe it). */
  forceExit?: (code: number) => void;
}

/** The exit status of a stop forced by a second signal. */
const FORCED_EXIT_CODE = 1;

type Phase = 'new' | 'starting' | 'running' | 'stopping' | 'stopped';

export class Manager {
  private readonly store: ManagerOptions['store'];
  private readonly elector: LeaderElector;
  private readonly bind: BindAddress | undefined;
  private readonly probeLimits: ListenerLimits;
  private readonly gracePeriodMs: number;
  private readonly cacheSyncTimeoutMs: number;
  private readonly signalWindowMs: number;
  private readonly forceExit: (code: number) => void;
  private readonly log: Logger;
  private readonly clock: Clock;

  private readonly runnables: Runnable[] = [];
  private readonly healthz = new Map<string, HealthCheck>();
  private readonly readyz = new Map<string, HealthCheck>();
  private phase: Phase = 'new';
  private cachesSynced = false;
  private started = false;

  /** Aborts always-on runnables (and, through `leaderScope`, leader-only ones). */
  private readonly intake = new AbortController();
  private readonly election = new AbortController();
  private leaderScope: AbortController | undefined;
  private readonly running = new Map<string, Promise<void>>();
  private electionDone: Promise<void> | undefined;
  private server: Server | undefined;
  private fatal: unknown;
  private stopping: Promise<void> | undefined;
  private resolveDone!: () => void;
  private rejectDone!: (e: unknown) => void;
  private readonly done: Promise<void>;
  private readonly startedWaiters: Array<() => void> = [];

  constructor(opts: ManagerOptions = {}) {
    this.store = opts.store;
    this.elector = opts.elector ?? new StandaloneElector();
    // Unset, empty or "0": no probe server.
    this.bind = opts.healthProbeBindAddress
      ? (parseBindAddress(opts.healthProbeBindAddress, 'health probe bind address') ?? undefined)
      : undefined;
    this.probeLimits = opts.healthProbeLimits ?? {
      ...DEFAULT_LISTENER_TIMEOUTS,
      maxConnections: DEFAULT_HEALTH_PROBE_MAX_CONNECTIONS,
    };
    const problem = limitsProblem(this.probeLimits);
    if (problem) throw new Error(`health probe listener: ${problem}`);
    this.gracePeriodMs = opts.gracePeriodMs ?? 30_000;
    this.cacheSyncTimeoutMs = opts.cacheSyncTimeoutMs ?? 120_000;
    this.signalWindowMs = opts.signalWindowMs ?? 1000;
    this.forceExit = opts.forceExit ?? ((code) => process.exit(code));
    this.log = opts.log ?? silentLogger();
    this.clock = opts.clock ?? systemClock;
    this.done = new Promise<void>((resolve, reject) => {
      this.resolveDone = resolve;
      this.rejectDone = reject;
    });
    this.done.catch(() => {}); // observed through start()/run()
    this.readyz.set('started', () => {
      if (!this.cachesSynced) throw new Error('caches not synced');
      if (!this.started) throw new Error('not started');
      if (this.phase === 'stopping' || this.phase === 'stopped') throw new Error('shutting down');
    });
  }

  /** Registers a runnable; after start, always-on ones start at once (leader-only when leading). */
  add(r: Runnable): void {
    if (this.phase === 'stopping' || this.phase === 'stopped') {
      throw new Error(`manager: cannot add runnable ${r.name} while stopping`);
    }
    this.runnables.push(r);
    if (this.started && !r.needLeaderElection) this.launch(r, this.intake.signal);
    if (r.needLeaderElection && this.leaderScope && !this.leaderScope.signal.aborted) {
      this.launch(r, this.leaderScope.signal);
    }
  }

  addHealthzCheck(name: string, check: HealthCheck): void {
    this.healthz.set(name, check);
  }

  addReadyzCheck(name: string, check: HealthCheck): void {
    this.readyz.set(name, check);
  }

  /** The health server's actual address (port 0 resolved), once listening. */
  healthAddress(): AddressInfo | undefined {
    const a = this.server?.address();
    return a && typeof a === 'object' ? a : undefined;
  }

  isLeader(): boolean {
    return this.elector.isLeader();
  }

  /** Resolves once caches are synced and always-on runnables started. */
  whenStarted(): Promise<void> {
    if (this.started) return Promise.resolve();
    return new Promise((resolve) => this.startedWaiters.push(resolve));
  }

  /**
   * Starts everything and resolves when the manager has stopped gracefully (`stop()`); rejects
   * with LeaderElectionLost, a cache sync failure or the first runnable failure.
   */
  async start(): Promise<void> {
    if (this.phase !== 'new') throw new Error('manager: already started');
    this.phase = 'starting';
    this.startSequence().catch((e) => this.fail(e));
    return this.done;
  }

  /**
   * `start()` with SIGTERM/SIGINT triggering a graceful stop, then `afterStop` (what the process
   * closes after the manager: the standalone store's final snapshot, the state lock). The
   * handlers stay until `afterStop` is done, so a signal then is still counted, never the
   * default action that kills the process mid-write. Signals within `signalWindowMs` of the
   * first are that stop; one after the window exits at once (`forceExit`). Rejects with the
   * manager's failure, else with `afterStop`'s.
   */
  async run(afterStop?: () => Promise<void>): Promise<void> {
    let firstAt: number | undefined;
    const onSignal = (sig: NodeJS.Signals) => {
      const now = this.clock.now();
      if (firstAt === undefined) {
        firstAt = now;
        this.log.info(
          { signal: sig },
          `shutting down gracefully (a signal ${this.signalWindowMs} ms or more from now exits at once)`,
        );
        void this.stop();
        return;
      }
      if (now - firstAt < this.signalWindowMs) {
        this.log.debug({ signal: sig }, 'signal within the window of the first: already shutting down');
        return;
      }
      this.log.warn({ signal: sig }, 'second signal: exiting immediately');
      this.forceExit(FORCED_EXIT_CODE);
    };
    process.on('SIGTERM', onSignal);
    process.on('SIGINT', onSignal);
    let failure: { err: unknown } | undefined;
    try {
      await this.start();
    } catch (err) {
      failure = { err };
    }
    try {
      await afterStop?.();
    } catch (err) {
      failure ??= { err };
    } finally {
      process.off('SIGTERM', onSignal);
      process.off('SIGINT', onSignal);
    }
    if (failure) throw failure.err;
  }

  /**
   * Resolves once every runnable has returned, including one that outlived the grace period:
   * whoever guards what a runnable writes or listens on (the standalone state lock) waits here.
   */
  async settled(): Promise<void> {
    await Promise.allSettled([...this.running.values()]);
  }

  /** Graceful stop; resolves when everything is down (idempotent). */
  stop(): Promise<void> {
    this.stopping ??= this.shutdown();
    return this.stopping;
  }

  private async startSequence(): Promise<void> {
    if (this.bind) await this.listen(this.bind);
    if (this.store) await this.syncCaches(this.store);
    if (this.intake.signal.aborted) return;
    this.cachesSynced = true;
    for (const r of this.runnables) if (!r.needLeaderElection) this.launch(r, this.intake.signal);
    this.started = true;
    this.phase = 'running';
    for (const w of this.startedWaiters.splice(0)) w();
    this.log.info({ identity: this.elector.identity }, 'manager started; campaigning for leadership');
    this.electionDone = this.elector
      .run(this.election.signal, {
        onStartedLeading: (signal) => this.startLeading(signal),
        onStoppedLeading: () => this.stoppedLeading(),
        onNewLeader: (id) => this.log.info({ leader: id }, 'new leader observed'),
      })
      .catch((e) =>
        this.fail(new LeaderElectionLost(`leader election failed: ${errorMessage(e)}`, { cause: e })),
      );
  }

  private async syncCaches(store: NonNullable<ManagerOptions['store']>): Promise<void> {
    const timeout = timeoutSignal(this.clock, this.cacheSyncTimeoutMs);
    const signal = AbortSignal.any([this.intake.signal, timeout.signal]);
    try {
      await store.start(this.intake.signal);
      await Promise.all([
        store.proxies.synced(signal),
        store.proxyPools?.synced(signal),
        store.providerHealths.synced(signal),
        store.secrets.synced(signal),
      ]);
    } catch (e) {
      if (this.intake.signal.aborted) return;
      if (timeout.signal.aborted) {
        throw new Error(`caches did not sync within ${this.cacheSyncTimeoutMs} ms`);
      }
      throw e;
    } finally {
      timeout.cancel();
    }
    this.log.info('caches synced');
  }

  private startLeading(electorSignal: AbortSignal): void {
    if (this.intake.signal.aborted) return;
    this.log.info({ identity: this.elector.identity }, 'became leader; starting leader-only runnables');
    const scope = new AbortController();
    this.leaderScope = scope;
    const end = () => scope.abort();
    electorSignal.addEventListener('abort', end, { once: true });
    this.intake.signal.addEventListener('abort', end, { once: true });
    for (const r of this.runnables) if (r.needLeaderElection) this.launch(r, scope.signal);
  }

  private stoppedLeading(): void {
    this.leaderScope?.abort();
    if (this.phase === 'stopping' || this.phase === 'stopped') return;
    this.log.error({ identity: this.elector.identity }, 'leader election lost; stopping');
    this.fail(new LeaderElectionLost());
  }

  private launch(r: Runnable, signal: AbortSignal): void {
    const key = `${r.needLeaderElection ? 'leader' : 'always'}:${r.name}:${this.running.size}`;
    const p = (async () => {
      try {
        await r.start(signal);
        if (!signal.aborted) this.log.info({ runnable: r.name }, 'runnable finished');
      } catch (e) {
        if (signal.aborted && (this.phase === 'stopping' || this.phase === 'stopped')) {
          this.log.warn({ runnable: r.name, err: e }, 'runnable failed while stopping');
          return;
        }
        this.fail(new Error(`runnable ${r.name} failed: ${errorMessage(e)}`, { cause: e }));
      }
    })();
    this.running.set(key, p);
  }

  private fail(e: unknown): void {
    if (this.fatal === undefined) this.fatal = e;
    void this.stop();
  }

  private async shutdown(): Promise<void> {
    if (this.phase === 'stopped') return;
    const lost = this.fatal instanceof LeaderElectionLost;
    this.phase = 'stopping';
    this.intake.abort();
    const drained = await settleWithin([...this.running.values()], this.gracePeriodMs, this.clock);
    if (!drained) this.log.warn({ gracePeriodMs: this.gracePeriodMs }, 'runnables did not drain in time');
    if (!lost) {
      try {
        await this.elector.release();
      } catch (e) {
        this.log.warn({ err: e }, 'releasing the leader lease failed');
      }
    }
    this.election.abort();
    if (this.electionDone) await settleWithin([this.electionDone], 5_000, this.clock);
    if (this.store) {
      try {
        await this.store.stop();
      } catch (e) {
        this.log.warn({ err: e }, 'stopping caches failed');
      }
    }
    await this.closeServer();
    this.phase = 'stopped';
    for (const w of this.startedWaiters.splice(0)) w();
    if (this.fatal !== undefined) this.rejectDone(this.fatal);
    else this.resolveDone();
  }

  private listen(bind: BindAddress): Promise<void> {
    const server = createListener((req, res) => void this.serve(req, res), this.probeLimits);
    this.server = server;
    return new Promise((resolve, reject) => {
      server.once('error', reject);
      server.listen(bind.port, bind.host, () => {
        server.off('error', reject);
        if (this.phase === 'stopping' || this.phase === 'stopped') server.close();
        resolve();
      });
    });
  }

  private closeServer(): Promise<void> {
    const server = this.server;
    if (!server) return Promise.resolve();
    return new Promise((resolve) => {
      server.close(() => resolve());
      server.closeAllConnections();
    });
  }

  private async serve(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const url = new URL(req.url ?? '/', 'http://probe');
    const path = url.pathname.replace(/\/+$/, '');
    const checks = path === '/healthz' ? this.healthz : path === '/readyz' ? this.readyz : undefined;
    if (!checks || (req.method !== 'GET' && req.method !== 'HEAD')) {
      res.writeHead(404, { 'content-type': 'text/plain; charset=utf-8' }).end('not found\n');
      return;
    }
    const results = await runChecks(checks);
    const ok = results.every((r) => r.ok);
    const verbose = url.searchParams.has('verbose') || !ok;
    const lines = results.map((r) =>
      r.ok ? `[+]${r.name} ok${r.note ? `: ${r.note}` : ''}` : `[-]${r.name} failed: ${r.reason}`,
    );
    const body = verbose
      ? `${lines.join('\n')}\n${path.slice(1)} ${ok ? 'check passed' : 'check failed'}\n`
      : 'ok';
    res.writeHead(ok ? 200 : 500, {
      'content-type': 'text/plain; charset=utf-8',
      'cache-control': 'no-store',
    });
    res.end(req.method === 'HEAD' ? undefined : body);
  }
}

async function runChecks(
  checks: Map<string, HealthCheck>,
): Promise<Array<{ name: string; ok: boolean; reason?: string; note?: string }>> {
  return Promise.all(
    [...checks].map(async ([name, check]) => {
      try {
        const note = await check();
        return note ? { name, ok: true, note } : { name, ok: true };
      } catch (e) {
        return { name, ok: false, reason: errorMessage(e) };
      }
    }),
  );
}

/** Waits for all promises to settle, or for `ms`; true when all settled in time. */
async function settleWithin(ps: Promise<unknown>[], ms: number, clock: Clock): Promise<boolean> {
  let timer: TimerHandle | undefined;
  const timeout = new Promise<false>((resolve) => {
    timer = clock.setTimeout(() => resolve(false), ms);
  });
  try {
    return await Promise.race([Promise.allSettled(ps).then(() => true as const), timeout]);
  } finally {
    if (timer) clock.clearTimeout(timer);
  }
}
