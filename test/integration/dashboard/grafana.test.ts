/**
 * config/grafana/egress-proxies-operator.json against a running standalone instance: every
 * metric a panel queries is exported on /metrics (histograms through their _bucket series), and
 * the dashboard is well formed — unique panel ids, the Prometheus datasource variable on every
 * query, no panels overlapping.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { trace } from '@opentelemetry/api';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { type App, buildApp } from '../../../src/cmd/compose.ts';
import { parseCommandLine } from '../../../src/cmd/flags.ts';
import { silentLogger } from '../../../src/log/index.ts';
import { cleanupCli, createWorkspace, freePort, REPO_ROOT, standaloneArgs } from '../../support/cli.ts';
import { until } from '../../support/wait.ts';

vi.setConfig({ testTimeout: 60_000, hookTimeout: 90_000 });

interface Target {
  expr: string;
  datasource?: { uid?: string };
}
interface Panel {
  id: number;
  type: string;
  title: string;
  gridPos: { x: number; y: number; w: number; h: number };
  datasource?: { uid?: string };
  targets?: Target[];
}

const dashboard = JSON.parse(
  readFileSync(join(REPO_ROOT, 'config/grafana/egress-proxies-operator.json'), 'utf8'),
) as { panels: Panel[]; templating: { list: { name: string; type: string }[] } };
const queries = dashboard.panels.flatMap((p) => (p.targets ?? []).map((t) => ({ panel: p.title, ...t })));

/** Metric names in a PromQL expression (ours, Node's and the process's). */
function metricNames(expr: string): string[] {
  return [...expr.matchAll(/\b((?:proxy_operator|nodejs|process)_[a-z0-9_]+)\b/g)].map((m) => m[1] ?? '');
}

/** Grafana's reference to the dashboard's datasource variable. */
const DATASOURCE_VAR = ['$', '{datasource}'].join('');

let app: App;
let running: Promise<void>;
let exposition = '';

beforeAll(async () => {
  const ws = await createWorkspace();
  const metricsPort = await freePort();
  // --egress-ip-url turns on the optional egress-IP check, whose metrics exist only with it.
  const parsed = parseCommandLine(
    standaloneArgs(ws, [
      '--metrics-bind-address',
      `127.0.0.1:${metricsPort}`,
      '--egress-ip-url',
      'http://127.0.0.1:9/ip',
    ]),
  );
  if (parsed.command !== 'standalone') throw new Error('not standalone');
  app = await buildApp(parsed, {
    log: silentLogger(),
    env: {},
    deps: {
      setupTracing: () => ({ tracer: trace.getTracer('test'), enabled: false, shutdown: async () => {} }),
    },
  });
  running = app.run();
  exposition = await until(
    '/metrics answering',
    async () => {
      const res = await fetch(`http://127.0.0.1:${metricsPort}/metrics`).catch(() => undefined);
      return res?.ok ? res.text() : undefined;
    },
    { timeoutMs: 30_000 },
  );
});

afterAll(async () => {
  await app?.stop();
  await running?.catch(() => undefined);
  await cleanupCli();
});

describe('Grafana dashboard', () => {
  it('queries only metrics a running instance exports', () => {
    const types = new Map<string, string>();
    for (const m of exposition.matchAll(/^# TYPE (\S+) (\S+)$/gm)) types.set(m[1] ?? '', m[2] ?? '');
    expect(types.size).toBeGreaterThan(20);
    const exported = (name: string): boolean => {
      if (types.has(name)) return true;
      const base = name.replace(/_(bucket|sum|count)$/, '');
      return base !== name && types.get(base) === 'histogram';
    };
    const names = new Set(queries.flatMap((q) => metricNames(q.expr)));
    expect(names.size).toBeGreaterThan(15);
    expect([...names].filter((n) => !exported(n))).toEqual([]);
  });

  it('covers fleet by phase, health, probe latency, leases and refusals, reconcile errors and provider health', () => {
    const all = queries.map((q) => q.expr).join('\n');
    for (const metric of [
      'proxy_operator_proxies',
      'proxy_operator_proxies_healthy',
      'proxy_operator_healthcheck_duration_seconds_bucket',
      'proxy_operator_lease_requests_total',
      'proxy_operator_reconcile_total',
      'proxy_operator_provider_target_up',
    ])
      expect(metricNames(all)).toContain(metric);
  });

  it('is well formed: unique ids, the datasource variable everywhere, no overlapping panels', () => {
    const ids = dashboard.panels.map((p) => p.id);
    expect(new Set(ids).size).toBe(ids.length);
    expect(dashboard.templating.list).toContainEqual(
      expect.objectContaining({ name: 'datasource', type: 'datasource' }),
    );
    for (const p of dashboard.panels.filter((x) => x.type !== 'row')) {
      expect(p.datasource?.uid, p.title).toBe(DATASOURCE_VAR);
      for (const t of p.targets ?? []) expect(t.datasource?.uid, p.title).toBe(DATASOURCE_VAR);
      expect(p.gridPos.x + p.gridPos.w, p.title).toBeLessThanOrEqual(24);
    }
    const cells = new Set<string>();
    for (const p of dashboard.panels) {
      for (let x = p.gridPos.x; x < p.gridPos.x + p.gridPos.w; x++)
        for (let y = p.gridPos.y; y < p.gridPos.y + p.gridPos.h; y++) {
          const cell = `${x},${y}`;
          expect(cells.has(cell), `${p.title} overlaps at ${cell}`).toBe(false);
          cells.add(cell);
        }
    }
  });
});
