/**
 * metrics/scrape — gauges computed at scrape time from state owned elsewhere (caches, stores),
 * instead of being updated as events happen and drifting.
 */
import type { Gauge, LabelValues, Registry } from 'prom-client';
import { collectedGauge } from './register.ts';

export type ScrapeSample<L extends string> = [labels: LabelValues<L>, value: number];

/**
 * A gauge whose series are rebuilt from `collect()` at every scrape: series absent from the
 * latest answer disappear, so values never drift and deleted objects never leak series. Use it
 * for state owned elsewhere (proxies by phase from the cache, active leases from the store).
 * `collect` should be cheap and must not throw (a throw fails that scrape with a 500).
 * Registering the same name again replaces the earlier gauge (see register.ts).
 */
export function registerScrapeGauge<L extends string>(
  registry: Registry,
  name: string,
  help: string,
  labelNames: readonly L[],
  collect: () => Iterable<ScrapeSample<L>> | Promise<Iterable<ScrapeSample<L>>>,
): Gauge<L> {
  return collectedGauge<L>(registry, {
    name,
    help,
    labelNames,
    async collect() {
      const samples = await collect();
      this.reset();
      for (const [labels, value] of samples) this.set(labels, value);
    },
  });
}
