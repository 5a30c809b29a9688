/// <reference lib="dom" />
/**
 * dashboard/web/chart — the latency sparkline: one SVG polyline per proxy over the history
 * window, gaps where the proxy was unhealthy, scaled to its own maximum.
 */
import { seriesStats } from './format.ts';

const SVG = 'http://www.w3.org/2000/svg';
const WIDTH = 120;
const HEIGHT = 24;

function svg<K extends keyof SVGElementTagNameMap>(
  tag: K,
  attrs: Record<string, string>,
): SVGElementTagNameMap[K] {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  return el;
}

/** Runs of consecutive values as polyline point lists ("x,y x,y …"). */
function runs(values: readonly (number | null)[], max: number): string[] {
  const step = values.length > 1 ? WIDTH / (values.length - 1) : WIDTH;
  const out: string[] = [];
  let current: string[] = [];
  values.forEach((v, i) => {
    if (v === null) {
      if (current.length) out.push(current.join(' '));
      current = [];
      return;
    }
    const y = HEIGHT - 2 - (v / max) * (HEIGHT - 4);
    current.push(`${(i * step).toFixed(1)},${y.toFixed(1)}`);
  });
  if (current.length) out.push(current.join(' '));
  return out;
}

/** The sparkline of `values` (oldest first), with its min/mean/max as the tooltip. */
export function sparkline(values: readonly (number | null)[], stepSeconds: number): SVGSVGElement {
  const root = svg('svg', {
    class: 'spark',
    width: String(WIDTH),
    height: String(HEIGHT),
    viewBox: `0 0 ${WIDTH} ${HEIGHT}`,
    role: 'img',
  });
  const stats = seriesStats(values);
  const minutes = Math.round((values.length * stepSeconds) / 60);
  const title = svg('title', {});
  title.textContent = stats
    ? `latency, last ${minutes} min: min ${Math.round(stats.min)} ms, mean ${Math.round(stats.mean)} ms, max ${Math.round(stats.max)} ms`
    : `no latency in the last ${minutes} min`;
  root.append(title);
  if (!stats) return root;
  for (const points of runs(values, Math.max(stats.max, 1))) {
    // A single point would be invisible as a line: draw it as a dot.
    if (!points.includes(' ')) {
      const [x, y] = points.split(',');
      root.append(svg('circle', { cx: x ?? '0', cy: y ?? '0', r: '1.5' }));
    } else root.append(svg('polyline', { points }));
  }
  return root;
}
