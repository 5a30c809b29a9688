/**
 * metrics — the process's Prometheus registry and the registration helpers (register.ts). Components
 * register their own metrics on the Registry they are given (names prefixed `proxy_operator_`);
 * nothing uses prom-client's global registry.
 */
import { collectDefaultMetrics, Registry } from 'prom-client';

export { type Authorize, type AuthVerdict, bearerToken, tokenReviewAuthorizer } from './authorize.ts';
export { type BindAddress, closeServer, formatAddress, listenOn, parseBindAddress } from './bind.ts';
export { PROXIES_METRIC, registerProxyPhaseGauge } from './fleet.ts';
export { collectedGauge, counter, gauge, getOrCreate, histogram } from './register.ts';
export { registerScrapeGauge, type ScrapeSample } from './scrape.ts';
export { type MetricsServer, type MetricsServerOptions, startMetricsServer } from './server.ts';

export interface MetricsRegistryOptions {
  /** Standard process_* and nodejs_* metrics (unprefixed, as dashboards expect). Default true. */
  processMetrics?: boolean;
}

/** A fresh registry, with the standard process and Node.js runtime metrics unless disabled. */
export function createMetricsRegistry(opts: MetricsRegistryOptions = {}): Registry {
  const registry = new Registry();
  if (opts.processMetrics ?? true) collectDefaultMetrics({ register: registry });
  return registry;
}
