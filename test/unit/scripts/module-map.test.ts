import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { summary, withCurrentMap } from '../../../scripts/docs/module-map.ts';

describe('the module map in docs/architecture.md', () => {
  it('lists every source file with its header sentence (npm run docs:modules rewrites it)', () => {
    const doc = readFileSync(new URL('../../../docs/architecture.md', import.meta.url), 'utf8');
    expect(withCurrentMap(doc) === doc, 'module map out of date: run npm run docs:modules').toBe(true);
  });

  it('takes the first sentence of the header, after a shebang or a reference line', () => {
    const src =
      '#!/usr/bin/env node\n/// <reference lib="dom" />\n/**\n * x/y — does one thing. Then more.\n */\n';
    expect(summary(src)).toBe('does one thing.');
    expect(summary('const a = 1;\n')).toBe('(no header comment)');
  });
});
