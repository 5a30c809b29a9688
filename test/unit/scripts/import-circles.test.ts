/**
 * No import circle between files of src/, type-only imports included: a circle hides which
 * module is the lower floor, and the API types (src/api) import nothing of the rest at all.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join, normalize, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const ROOT = fileURLToPath(new URL('../../..', import.meta.url));
const SRC = join(ROOT, 'src');

function sourceFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((d) => {
    const path = join(dir, d.name);
    if (d.isDirectory()) return sourceFiles(path);
    return d.name.endsWith('.ts') ? [path] : [];
  });
}

/** Every relative import or re-export of each file (static, type-only and dynamic alike). */
function importGraph(): Map<string, string[]> {
  const graph = new Map<string, string[]>();
  const specifier = /(?:(?:import|export)\s[^'"]*?from\s+|import\()\s*['"](\.[^'"]+)['"]/g;
  for (const file of sourceFiles(SRC)) {
    const text = readFileSync(file, 'utf8');
    const deps = [...text.matchAll(specifier)].map((m) => normalize(join(dirname(file), m[1] as string)));
    graph.set(
      file,
      deps.filter((d) => d.startsWith(SRC)),
    );
  }
  return graph;
}

/** Strongly connected components of more than one file (Tarjan), as paths relative to the root. */
function circles(graph: Map<string, string[]>): string[][] {
  let next = 0;
  const index = new Map<string, number>();
  const low = new Map<string, number>();
  const stack: string[] = [];
  const onStack = new Set<string>();
  const found: string[][] = [];
  const visit = (v: string) => {
    index.set(v, next);
    low.set(v, next++);
    stack.push(v);
    onStack.add(v);
    for (const w of graph.get(v) ?? []) {
      if (!graph.has(w)) continue;
      if (!index.has(w)) {
        visit(w);
        low.set(v, Math.min(low.get(v) as number, low.get(w) as number));
      } else if (onStack.has(w)) low.set(v, Math.min(low.get(v) as number, index.get(w) as number));
    }
    if (low.get(v) !== index.get(v)) return;
    const component: string[] = [];
    let w: string;
    do {
      w = stack.pop() as string;
      onStack.delete(w);
      component.push(relative(ROOT, w));
    } while (w !== v);
    if (component.length > 1) found.push(component.sort());
  };
  for (const v of graph.keys()) if (!index.has(v)) visit(v);
  return found;
}

describe('the import graph of src/', () => {
  const graph = importGraph();

  it('has no circle, type-only imports included', () => {
    expect(circles(graph)).toEqual([]);
  });

  it('finds a circle when there is one (the check itself works)', () => {
    const a = join(SRC, 'a.ts');
    const b = join(SRC, 'b.ts');
    expect(
      circles(
        new Map([
          [a, [b]],
          [b, [a]],
        ]),
      ),
    ).toEqual([['src/a.ts', 'src/b.ts']]);
  });

  it('keeps the API types the ground floor: src/api imports nothing outside itself', () => {
    const apiDir = join(SRC, 'api');
    const outward = [...graph]
      .filter(([file]) => file.startsWith(apiDir))
      .flatMap(([file, deps]) =>
        deps
          .filter((d) => !d.startsWith(apiDir))
          .map((d) => `${relative(ROOT, file)} → ${relative(ROOT, d)}`),
      );
    expect(outward).toEqual([]);
  });

  it('keeps leases out of the reconciler: src/lease imports nothing of src/controller', () => {
    const outward = [...graph]
      .filter(([file]) => file.startsWith(join(SRC, 'lease')))
      .flatMap(([file, deps]) =>
        deps
          .filter((d) => d.startsWith(join(SRC, 'controller')))
          .map((d) => `${relative(ROOT, file)} → ${relative(ROOT, d)}`),
      );
    expect(outward).toEqual([]);
  });
});
