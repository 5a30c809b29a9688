/**
 * dashboard/history — the latency history behind the dashboard's charts: per proxy, the mean of
 * the latencies sampled in each fixed step, for a bounded window (90 steps of 10 s = 15 min by
 * default). Memory is steps × proxies, and a proxy's series goes when the proxy does.
 */
import type { LatencyHistoryBody } from './web/types.ts';

export const DEFAULT_HISTORY_STEP_MS = 10_000;
export const DEFAULT_HISTORY_STEPS = 90;

interface Series {
  /** Closed steps, oldest first; null = no healthy sample in that step. */
  values: (number | null)[];
  /** The step being filled: its index and running sum/count. */
  step: number;
  sum: number;
  count: number;
}

export class LatencyHistory {
  private readonly series = new Map<string, Series>();

  readonly stepMs: number;
  readonly steps: number;

  constructor(stepMs = DEFAULT_HISTORY_STEP_MS, steps = DEFAULT_HISTORY_STEPS) {
    this.stepMs = stepMs;
    this.steps = steps;
    if (!(stepMs > 0) || !Number.isInteger(steps) || steps < 1)
      throw new Error('history step and length must be positive');
  }

  /** One sample at `now`: a latency, or null when the proxy is unhealthy or unprobed. */
  record(key: string, latencyMillis: number | null, now: number): void {
    const step = Math.floor(now / this.stepMs);
    let s = this.series.get(key);
    if (!s) {
      s = { values: [], step, sum: 0, count: 0 };
      this.series.set(key, s);
    }
    this.advance(s, step);
    if (latencyMillis !== null && Number.isFinite(latencyMillis)) {
      s.sum += latencyMillis;
      s.count++;
    }
  }

  /** Keeps only the series of `keys` (the proxies that still exist). */
  retain(keys: ReadonlySet<string>): void {
    for (const key of this.series.keys()) if (!keys.has(key)) this.series.delete(key);
  }

  get size(): number {
    return this.series.size;
  }

  /**
   * The series up to and including the step of `now`, all of length `steps`: every proxy's, or
   * those of `keys` (the rows a viewer shows) that exist.
   */
  body(now: number, keys?: readonly string[]): LatencyHistoryBody {
    const step = Math.floor(now / this.stepMs);
    const out: Record<string, (number | null)[]> = {};
    const picked = keys
      ? keys.flatMap((k): [string, Series][] => {
          const s = this.series.get(k);
          return s ? [[k, s]] : [];
        })
      : this.series;
    for (const [key, s] of picked) {
      this.advance(s, step);
      const values = [...s.values, s.count > 0 ? round(s.sum / s.count) : null];
      const padded =
        values.length >= this.steps
          ? values.slice(-this.steps)
          : [...Array<null>(this.steps - values.length).fill(null), ...values];
      out[key] = padded;
    }
    return { stepSeconds: this.stepMs / 1000, end: new Date(step * this.stepMs).toISOString(), series: out };
  }

  /** Closes the steps before `step` (gaps as null) and drops what falls out of the window. */
  private advance(s: Series, step: number): void {
    if (step <= s.step) return;
    s.values.push(s.count > 0 ? round(s.sum / s.count) : null);
    const gap = Math.min(step - s.step - 1, this.steps);
    for (let i = 0; i < gap; i++) s.values.push(null);
    if (s.values.length > this.steps - 1) s.values.splice(0, s.values.length - (this.steps - 1));
    s.step = step;
    s.sum = 0;
    s.count = 0;
  }
}

/** One decimal: enough for a chart, half the bytes. */
function round(ms: number): number {
  return Math.round(ms * 10) / 10;
}
