/**
 * metrics/register — the one way components register metrics on the Registry they are given.
 * A second instance of a component on the same registry (a runnable built again, a test) must
 * not throw "already registered": event metrics (counters, histograms, plain gauges) reuse the
 * series already there, so counts keep accumulating; scrape-time gauges are replaced, because
 * their `collect` reads the state of one instance and the newest one is the live one.
 */
import {
  Counter,
  type CounterConfiguration,
  Gauge,
  type GaugeConfiguration,
  Histogram,
  type HistogramConfiguration,
  type Metric,
  type Registry,
} from 'prom-client';

type MetricClass<M> = abstract new (...args: never[]) => M;

/**
 * The metric registered under `name`, or a new one from `create`. A metric of another type or
 * with other label names under that name is a programming error and throws.
 */
export function getOrCreate<M extends Metric>(
  registry: Registry,
  kind: MetricClass<M>,
  name: string,
  labelNames: readonly string[] | undefined,
  create: () => M,
): M {
  const found = registry.getSingleMetric(name);
  return found === undefined ? create() : compatible(found, kind, name, labelNames);
}

function compatible<M>(
  found: Metric,
  kind: MetricClass<M>,
  name: string,
  labelNames: readonly string[] | undefined,
): M {
  if (!(found instanceof kind)) {
    throw new Error(`metric ${name} is already registered as a different type`);
  }
  const have = (found as unknown as { labelNames?: readonly string[] }).labelNames ?? [];
  if (have.join(',') !== (labelNames ?? []).join(',')) {
    throw new Error(`metric ${name} is already registered with labels [${have.join(', ')}]`);
  }
  return found;
}

type Config<C> = Omit<C, 'registers'>;

export function counter<L extends string = string>(
  registry: Registry,
  config: Config<CounterConfiguration<L>>,
): Counter<L> {
  return getOrCreate(
    registry,
    Counter,
    config.name,
    config.labelNames,
    () => new Counter<L>({ ...config, registers: [registry] }),
  ) as Counter<L>;
}

export function histogram<L extends string = string>(
  registry: Registry,
  config: Config<HistogramConfiguration<L>>,
): Histogram<L> {
  return getOrCreate(
    registry,
    Histogram,
    config.name,
    config.labelNames,
    () => new Histogram<L>({ ...config, registers: [registry] }),
  ) as Histogram<L>;
}

/** A gauge set as events happen (no `collect`); see `collectedGauge` for scrape-time ones. */
export function gauge<L extends string = string>(
  registry: Registry,
  config: Config<Omit<GaugeConfiguration<L>, 'collect'>>,
): Gauge<L> {
  return getOrCreate(
    registry,
    Gauge,
    config.name,
    config.labelNames,
    () => new Gauge<L>({ ...config, registers: [registry] }),
  ) as Gauge<L>;
}

/**
 * A gauge whose value `collect` computes at scrape time. Registering the name again replaces
 * the earlier gauge: its `collect` reads an instance that has been superseded.
 */
export function collectedGauge<L extends string = string>(
  registry: Registry,
  config: Config<GaugeConfiguration<L>> & Required<Pick<GaugeConfiguration<L>, 'collect'>>,
): Gauge<L> {
  const found = registry.getSingleMetric(config.name);
  if (found !== undefined) {
    compatible(found, Gauge, config.name, config.labelNames);
    registry.removeSingleMetric(config.name);
  }
  return new Gauge<L>({ ...config, registers: [registry] });
}

/** One label set of a counter, counted as a plain number until the next scrape. */
export interface CounterCell {
  inc(): void;
}

class PendingCell implements CounterCell {
  pending = 0;
  readonly labels: Partial<Record<string, string>>;
  constructor(labels: Partial<Record<string, string>>) {
    this.labels = labels;
  }
  inc(): void {
    this.pending++;
  }
}

const pendingByCounter = new WeakMap<Counter, PendingCell[]>();

/**
 * Label-bound cells of `counter` for hot paths: `cell.inc()` adds to a number, and the counts
 * reach prom-client when the counter is read (a scrape, `get()`), so the request path does not
 * hash label values into a key on every increment (docs/benchmarks.md, "Lease API"). Each call
 * of the returned function makes a new cell: make one per label set and keep it. Cells of every
 * caller of the same counter are handed over together.
 */
export function counterCells<L extends string>(
  counter: Counter<L>,
  labelNames: readonly L[],
): (...values: string[]) => CounterCell {
  let cells = pendingByCounter.get(counter as Counter);
  if (!cells) {
    const all: PendingCell[] = [];
    cells = all;
    pendingByCounter.set(counter as Counter, all);
    const previous = (counter as { collect?: () => unknown }).collect;
    (counter as { collect?: () => unknown }).collect = function flush(this: Counter<L>) {
      for (const cell of all) {
        if (cell.pending === 0) continue;
        counter.inc(cell.labels as Partial<Record<L, string>>, cell.pending);
        cell.pending = 0;
      }
      return previous?.call(this);
    };
  }
  const list = cells;
  return (...values) => {
    const labels: Partial<Record<string, string>> = {};
    labelNames.forEach((name, i) => {
      labels[name] = values[i];
    });
    const cell = new PendingCell(labels);
    list.push(cell);
    return cell;
  };
}
