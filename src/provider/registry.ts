/**
 * provider/registry — builds every configured provider, all or nothing, and hands out the
 * decorated providers (metrics, tracing, errors attributed to the provider) by name. Health checks are collected from the raw
 * providers before decoration, so they bypass the decorators.
 *
 * Construction contract for factories: throw only for configuration that can never work (a bad
 * field, an unparsable key). Anything that can heal later — a Secret mount not there yet, a
 * backend that is down — must NOT fail construction: the provider warns, fails only its own
 * calls, and recovers on its own. The registry does not second-guess; it propagates.
 */
import { type Tracer, trace } from '@opentelemetry/api';
import type { Logger } from 'pino';
import type { Registry } from 'prom-client';
import type { ProviderEntry, ProvidersConfig, ProviderType } from '../config/schema.ts';
import { errorMessage } from '../log/errors.ts';
import { silentLogger } from '../log/index.ts';
import { TRACER_NAME } from '../tracing/index.ts';
import { type Checker, canRestart, isChecker, type Provider } from './contract.ts';
import { providerMetrics, withErrorOrigin, withMetrics, withTracing } from './decorators.ts';

export interface ProviderDeps {
  log: Logger;
  /** Metrics registry: the decorators register on it; providers may add their own metrics. */
  registry: Registry;
  /** Default: the global tracer (a no-op unless tracing was set up). */
  tracer?: Tracer;
  /** Anything else a factory needs (KubeConfig, operator namespace, clock …). */
  [extra: string]: unknown;
}

/** Builds one provider from its config entry. May be async; must honour the contract above. */
export type ProviderFactory = (entry: ProviderEntry, deps: ProviderDeps) => Provider | Promise<Provider>;

export interface ProviderRegistry {
  /** The decorated provider, or undefined when no provider of that name is configured. */
  get(name: string): Provider | undefined;
  /** Provider names in config order. */
  names(): string[];
  /** [name, decorated provider] in config order. */
  entries(): Array<[string, Provider]>;
  /** The raw providers that implement Checker, by name: checks bypass metrics and tracing. */
  checkers(): Map<string, Checker>;
  /** The provider's type (kubernetes, gcp, kvm, local, aws), or undefined when not configured. */
  type(name: string): string | undefined;
  /**
   * Whether the provider can give a running instance a new IP in place (contract `restart`,
   * pool rotation `strategy: Restart`); undefined when not configured.
   */
  canRestart(name: string): boolean | undefined;
  /** Closes every provider (concurrently, once); failures are logged, never thrown. */
  close(): Promise<void>;
}

/** Thrown by buildProviders: one line per failing entry, `providers[i] (name): message`. */
export class ProviderBuildError extends Error {
  readonly failures: ReadonlyArray<{ index: number; name: string; message: string }>;
  constructor(failures: ReadonlyArray<{ index: number; name: string; message: string }>) {
    const lines = failures.map((f) => `providers[${f.index}] (${f.name}): ${f.message}`);
    super(
      failures.length === 1
        ? `provider construction failed: ${lines[0]}`
        : `provider construction failed:\n  ${lines.join('\n  ')}`,
    );
    this.name = 'ProviderBuildError';
    this.failures = failures;
  }
}

/**
 * Constructs every entry (concurrently). If any factory throws, the ones already built are
 * closed and one ProviderBuildError names every failing entry; nothing is returned half-built.
 */
export async function buildProviders(
  config: ProvidersConfig,
  factories: Partial<Record<ProviderType, ProviderFactory>>,
  deps: ProviderDeps,
): Promise<ProviderRegistry> {
  const log = deps.log ?? silentLogger();
  const failures: Array<{ index: number; name: string; message: string }> = [];
  const seen = new Map<string, number>();
  config.providers.forEach((entry, index) => {
    const first = seen.get(entry.name);
    if (first !== undefined) {
      failures.push({ index, name: entry.name, message: `duplicate name (also providers[${first}])` });
    } else seen.set(entry.name, index);
  });
  if (failures.length > 0) throw new ProviderBuildError(failures);

  const settled = await Promise.allSettled(
    config.providers.map(async (entry) => {
      // Read through string: ProviderEntry['type'] currently infers as never from the schema.
      const type = (entry as { type: string }).type as ProviderType;
      const factory = Object.hasOwn(factories, type) ? factories[type] : undefined;
      if (!factory) throw new Error(`provider type "${type}" is not available in this mode`);
      // The one place a provider's log lines get their `provider` key; providers add none.
      const p = await factory(entry, { ...deps, log: log.child({ provider: entry.name }) });
      if (p.name !== entry.name || p.type !== type) {
        // A mislabelled provider would attribute metrics and orphan sweeps to the wrong name.
        await closeQuietly(p, log);
        throw new Error(`factory returned provider ${p.name}/${p.type}, want ${entry.name}/${type}`);
      }
      return p;
    }),
  );

  const built: Provider[] = [];
  settled.forEach((r, index) => {
    const name = config.providers[index]!.name;
    if (r.status === 'fulfilled') built.push(r.value);
    else failures.push({ index, name, message: errorMessage(r.reason) });
  });
  if (failures.length > 0) {
    await Promise.all(built.map((p) => closeQuietly(p, log)));
    throw new ProviderBuildError(failures);
  }
  return providerRegistryFrom(built, deps);
}

/**
 * A registry over providers that already exist (buildProviders uses it; tests and embedders can
 * too): each is decorated as withErrorOrigin(withTracing(withMetrics(raw))), so every consumer
 * (reconciler, orphan sweep) sees ProviderErrors, and tracing still sees the raw error: a foreign
 * message is never recorded on a span as if it were a ProviderError's.
 */
export function providerRegistryFrom(
  raw: readonly Provider[],
  deps: { log?: Logger; registry: Registry; tracer?: Tracer },
): ProviderRegistry {
  const log = deps.log ?? silentLogger();
  const metrics = providerMetrics(deps.registry);
  const tracer = deps.tracer ?? trace.getTracer(TRACER_NAME);
  const decorated = new Map<string, Provider>();
  const rawByName = new Map<string, Provider>();
  const checkers = new Map<string, Checker>();
  for (const p of raw) {
    if (rawByName.has(p.name)) throw new Error(`duplicate provider name ${p.name}`);
    rawByName.set(p.name, p);
    decorated.set(p.name, withErrorOrigin(withTracing(withMetrics(p, metrics), tracer)));
    if (isChecker(p)) checkers.set(p.name, p);
  }
  let closing: Promise<void> | undefined;
  return {
    get: (name) => decorated.get(name),
    names: () => [...decorated.keys()],
    entries: () => [...decorated.entries()],
    checkers: () => new Map(checkers),
    type: (name) => rawByName.get(name)?.type,
    canRestart: (name) => {
      const p = rawByName.get(name);
      return p === undefined ? undefined : canRestart(p);
    },
    close() {
      closing ??= Promise.all([...rawByName.values()].map((p) => closeQuietly(p, log))).then(() => {});
      return closing;
    },
  };
}

async function closeQuietly(p: Provider, log: Logger): Promise<void> {
  try {
    await p.close?.();
  } catch (err) {
    log.warn({ provider: p.name, err }, 'closing provider failed');
  }
}
