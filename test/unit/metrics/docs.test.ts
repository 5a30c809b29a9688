import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';

/**
 * docs/operations.md promises to list every metric the operator exports and to say honestly
 * which exist. This keeps that promise checked against the source tree.
 */
const root = join(import.meta.dirname, '..', '..', '..');

function sourceFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) =>
    e.isDirectory() ? sourceFiles(join(dir, e.name)) : e.name.endsWith('.ts') ? [join(dir, e.name)] : [],
  );
}

/** Metric names defined in src: string literals passed as a metric `name` (or constants). */
function definedMetrics(): Set<string> {
  const names = new Set<string>();
  for (const file of sourceFiles(join(root, 'src'))) {
    const text = readFileSync(file, 'utf8');
    for (const m of text.matchAll(/['"`](proxy_operator_[a-z0-9_]+)['"`]/g)) names.add(m[1]!);
  }
  return names;
}

/** Catalogue rows: metric name (prefix expanded) and the status column. */
function documentedMetrics(): Map<string, string> {
  const doc = readFileSync(join(root, 'docs', 'operations.md'), 'utf8');
  const rows = new Map<string, string>();
  for (const line of doc.split('\n')) {
    const m = /^\| `((?:proxy_operator_|…_)[a-z0-9_]+)` \|.*\| ([a-z]+)\b[^|]*\|$/.exec(line);
    if (m) rows.set(m[1]!.replace(/^…_/, 'proxy_operator_'), m[2]!);
  }
  return rows;
}

describe('docs/operations.md metric catalogue', () => {
  it('documents every proxy_operator_ metric defined in the source', () => {
    const documented = documentedMetrics();
    const missing = [...definedMetrics()].filter((n) => !documented.has(n));
    expect(missing).toEqual([]);
  });

  it('marks as exported exactly the documented metrics that exist in the source', () => {
    const defined = definedMetrics();
    const documented = documentedMetrics();
    expect(documented.size).toBeGreaterThan(15);
    const wrong = [...documented].filter(([name, status]) => (status === 'exported') !== defined.has(name));
    expect(wrong).toEqual([]);
  });
});
