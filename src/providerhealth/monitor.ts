/**
 * providerhealth/monitor — leader-only loop answering "can we reach each provider's backend
 * right now?" without waiting for a Proxy to fail: every interval it runs every provider's
 * Checker concurrently under one timeout, writes one ProviderHealth status per provider, logs
 * only transitions, and exports per-target gauges. Not wired to readiness on purpose: a dead
 * hypervisor must not make the operator unready while other providers work. A provider that
 * Proxies name but the config lacks (renamed, removed) is warned about at start and gets a
 * not-ready ProviderHealth of its own (providerhealth/stranded).
 */
import { type Tracer, trace } from '@opentelemetry/api';
import type { Registry } from 'prom-client';
import { API_VERSION, LABEL_MANAGED_BY, MANAGED_BY_VALUE, PROVIDER_HEALTH_KIND } from '../api/constants.ts';
import type { ProviderHealth, TargetCheck } from '../api/providerhealth.ts';
import { errorMessage } from '../log/errors.ts';
import { type Logger, silentLogger } from '../log/index.ts';
import { registerScrapeGauge, type ScrapeSample } from '../metrics/scrape.ts';
import type { Checker } from '../provider/contract.ts';
import { type Clock, sleep, systemClock, timeoutSignal } from '../runtime/clock.ts';
import { isNotFound, type ObjectStore } from '../runtime/store.ts';
import { buildStatus, type CheckResult } from './status.ts';
import { type StrandedProvider, strandedMessage, strandedProviders, strandedStatus } from './stranded.ts';

const MIN_INTERVAL_MS = 10_000;

export interface MonitoredProvider {
  name: string;
  type: string;
  /** The RAW provider's checker (bypassing metrics/tracing decorators), if it has one. */
  checker?: Checker;
}

export interface MonitorOptions {
  store: ObjectStore;
  providers: MonitoredProvider[];
  intervalMs: number;
  timeoutMs: number;
  log?: Logger;
  registry?: Registry;
  clock?: Clock;
  tracer?: Tracer;
}

/** The schedule rules of --provider-check-interval / --provider-check-timeout. */
export function validateSchedule(intervalMs: number, timeoutMs: number): string | undefined {
  if (intervalMs === 0) return undefined;
  if (intervalMs < MIN_INTERVAL_MS) return '--provider-check-interval must be 0 (off) or at least 10s';
  if (timeoutMs < 0 || timeoutMs > intervalMs) return '--provider-check-timeout must be at most the interval';
  return undefined;
}

const DNS1123_SUBDOMAIN = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
const isValidObjectName = (n: string): boolean => n.length <= 253 && DNS1123_SUBDOMAIN.test(n);

export interface ProviderResult extends CheckResult {
  provider: string;
  durationMs: number;
}

type TargetSample = ScrapeSample<'provider' | 'target'>;

export class ProviderHealthMonitor {
  private readonly opts: MonitorOptions;
  private readonly log: Logger;
  private readonly clock: Clock;
  private readonly tracer: Tracer;
  private latest: ProviderResult[] = [];
  private readonly prev = new Map<string, TargetCheck>();
  /** Missing providers whose ProviderHealth this monitor wrote. */
  private readonly strandedWritten = new Set<string>();

  constructor(opts: MonitorOptions) {
    this.opts = opts;
    this.log = opts.log ?? silentLogger();
    this.clock = opts.clock ?? systemClock;
    this.tracer = opts.tracer ?? trace.getTracer('egress-proxies-operator');
    if (opts.registry) this.registerGauges(opts.registry);
  }

  snapshot(): ProviderResult[] {
    return this.latest.map((r) => ({ ...r, targets: [...r.targets] }));
  }

  /** Runnable (leader only). */
  async start(signal: AbortSignal): Promise<void> {
    const stranded = this.stranded();
    for (const s of stranded) {
      this.log.warn({ provider: s.provider, proxies: s.proxies.length }, `WARNING: ${strandedMessage(s)}`);
    }
    const keep = new Set(
      this.opts.intervalMs > 0
        ? [...this.opts.providers.map((p) => p.name), ...stranded.map((s) => s.provider)]
        : [],
    );
    await this.cleanup(keep, signal);
    if (this.opts.intervalMs === 0) {
      this.log.info('provider checks are off (--provider-check-interval=0)');
      return;
    }
    for (const p of this.opts.providers) {
      if (!isValidObjectName(p.name)) {
        this.log.warn(
          { provider: p.name },
          'WARNING: provider name is not a valid object name; its ProviderHealth object is not written, its metrics are',
        );
      }
    }
    while (!signal.aborted) {
      await this.checkOnce(signal);
      try {
        await sleep(this.opts.intervalMs, signal, this.clock);
      } catch {
        return;
      }
    }
  }

  async checkOnce(signal: AbortSignal): Promise<ProviderResult[]> {
    return this.tracer.startActiveSpan('providerhealth.check', async (span) => {
      const timeout = timeoutSignal(this.clock, this.opts.timeoutMs);
      try {
        const round = AbortSignal.any([signal, timeout.signal]);
        const results = await Promise.all(this.opts.providers.map((p) => this.run(p, round)));
        this.latest = results;
        let notReady = 0;
        for (const r of results) {
          this.logTransitions(r);
          notReady += r.targets.filter((t) => !t.ready).length;
          try {
            await this.publish(r, signal);
          } catch (err) {
            this.log.error({ provider: r.provider, err }, 'writing provider health failed');
          }
        }
        await this.publishStranded(signal);
        span.setAttribute('providerhealth.providers', results.length);
        span.setAttribute('providerhealth.targets_not_ready', notReady);
        return results;
      } finally {
        timeout.cancel();
        span.end();
      }
    });
  }

  private async run(p: MonitoredProvider, signal: AbortSignal): Promise<ProviderResult> {
    const started = this.clock.now();
    let targets: TargetCheck[] = [];
    if (p.checker) {
      try {
        targets = await p.checker.check({ signal, log: this.log.child({ provider: p.name }) });
      } catch (err) {
        // Checkers must not throw; if one does, report it rather than losing the round.
        targets = [{ name: p.name, ready: false, reason: 'CheckFailed', message: errorMessage(err) }];
      }
    }
    const now = this.clock.now();
    return {
      provider: p.name,
      type: p.type,
      supported: p.checker !== undefined,
      targets,
      checkedAt: new Date(now),
      durationMs: now - started,
    };
  }

  private logTransitions(r: ProviderResult): void {
    for (const ts of r.targets) {
      const key = `${r.provider}/${ts.name}`;
      const prev = this.prev.get(key);
      this.prev.set(key, ts);
      const fields = { provider: r.provider, target: ts.name, address: ts.address, reason: ts.reason };
      if (!ts.ready && (!prev || prev.ready || prev.reason !== ts.reason)) {
        this.log.warn({ ...fields, message: ts.message }, 'WARNING: provider target not ready');
      } else if (ts.ready && prev && !prev.ready) {
        this.log.info({ ...fields, latencyMillis: ts.latencyMillis }, 'Provider target ready');
      } else if (ts.ready && !prev) {
        this.log.debug({ ...fields, latencyMillis: ts.latencyMillis }, 'Provider target ready');
      }
    }
  }

  /** One status write per provider per round, through the uncached reader. */
  private async publish(r: ProviderResult, signal: AbortSignal): Promise<void> {
    if (!isValidObjectName(r.provider)) return;
    await this.writeStatus(r.provider, (prev) => buildStatus(prev, r), signal);
  }

  private async writeStatus(
    name: string,
    next: (prev: ProviderHealth['status']) => NonNullable<ProviderHealth['status']>,
    signal: AbortSignal,
  ): Promise<void> {
    const client = this.opts.store.providerHealths;
    let obj: ProviderHealth;
    try {
      obj = await client.read({ name }, { signal });
    } catch (err) {
      if (!isNotFound(err)) throw err;
      obj = await client.create(
        {
          apiVersion: API_VERSION,
          kind: PROVIDER_HEALTH_KIND,
          metadata: { name, labels: { [LABEL_MANAGED_BY]: MANAGED_BY_VALUE } },
        },
        { signal },
      );
    }
    const status = next(obj.status);
    if (JSON.stringify(status) === JSON.stringify(obj.status)) return;
    await client.patchStatus({ name }, status as Record<string, unknown>, { signal });
  }

  private stranded(): StrandedProvider[] {
    return strandedProviders(this.opts.store.proxies.list(), new Set(this.opts.providers.map((p) => p.name)));
  }

  /** A not-ready ProviderHealth per missing provider; removed once no Proxy names it. */
  private async publishStranded(signal: AbortSignal): Promise<void> {
    const now = new Date(this.clock.now());
    const current = new Set<string>();
    for (const s of this.stranded()) {
      if (!isValidObjectName(s.provider)) continue;
      current.add(s.provider);
      try {
        await this.writeStatus(s.provider, (prev) => strandedStatus(prev, s, now), signal);
        this.strandedWritten.add(s.provider);
      } catch (err) {
        this.log.error({ provider: s.provider, err }, 'writing provider health failed');
      }
    }
    for (const name of this.strandedWritten) {
      if (current.has(name)) continue;
      try {
        await this.opts.store.providerHealths.delete({ name }, { signal });
        this.strandedWritten.delete(name);
        this.log.info({ provider: name }, 'no Proxy names the unconfigured provider any more');
      } catch (err) {
        if (isNotFound(err)) this.strandedWritten.delete(name);
        else this.log.error({ provider: name, err }, 'deleting provider health failed');
      }
    }
  }

  /** Delete our objects for providers no longer configured (all of them when checks are off). */
  private async cleanup(keep: Set<string>, signal: AbortSignal): Promise<void> {
    const client = this.opts.store.providerHealths;
    try {
      // One uncached list at start: these objects are never watched (least privilege).
      const ours = await client.readList({
        labelSelector: `${LABEL_MANAGED_BY}=${MANAGED_BY_VALUE}`,
        signal,
      });
      for (const obj of ours) {
        if (keep.has(obj.metadata.name)) continue;
        try {
          await client.delete({ name: obj.metadata.name }, { signal });
          this.log.info(
            { provider: obj.metadata.name },
            'deleted ProviderHealth of a provider no longer checked',
          );
        } catch (err) {
          if (!isNotFound(err)) throw err;
        }
      }
    } catch (err) {
      this.log.warn({ err }, 'cleaning up stale ProviderHealth objects failed; retried at next start');
    }
  }

  private registerGauges(registry: Registry): void {
    const labelNames = ['provider', 'target'] as const;
    const perTarget = (value: (r: ProviderResult, t: TargetCheck) => number) => (): TargetSample[] =>
      this.latest.flatMap((r) =>
        r.targets.map((t): TargetSample => [{ provider: r.provider, target: t.name }, value(r, t)]),
      );
    registerScrapeGauge(
      registry,
      'proxy_operator_provider_target_up',
      '1 when the provider target passed its last check, else 0.',
      labelNames,
      perTarget((_r, t) => (t.ready ? 1 : 0)),
    );
    registerScrapeGauge(
      registry,
      'proxy_operator_provider_check_duration_seconds',
      'Duration of the last check of the target.',
      labelNames,
      perTarget((r, t) => (t.latencyMillis ?? r.durationMs) / 1000),
    );
    registerScrapeGauge(
      registry,
      'proxy_operator_provider_check_timestamp_seconds',
      'Unix time of the last check of the target.',
      labelNames,
      perTarget((r) => r.checkedAt.getTime() / 1000),
    );
  }
}
