/**
 * The README quick start's reader and shape comparison (test/support/readme-quickstart), which
 * test/integration/cmd/readme-quickstart.test.ts runs the README with: commands, their output and
 * README lines read out of the marked blocks; run-to-run values normalised, everything else kept.
 */
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { compareOutput, normaliseLine, parseQuickstart } from '../../support/readme-quickstart.ts';

const DOC = [
  'intro',
  '<!-- quickstart -->',
  '```console',
  '$ echo one     # a comment',
  'one',
  '',
  '# a comment line',
  '$ curl -s -X POST http://127.0.0.1:8090/v1/leases \\',
  "    -d '{}'",
  '$ true',
  '```',
  '```console',
  '$ not run',
  '```',
].join('\n');

describe('parseQuickstart', () => {
  it('reads commands, continuation lines, outputs and README lines from marked blocks only', () => {
    expect(parseQuickstart(DOC)).toEqual([
      { line: 4, command: 'echo one     # a comment', output: ['one'], outputLine: 5 },
      {
        line: 8,
        command: "curl -s -X POST http://127.0.0.1:8090/v1/leases \\\n    -d '{}'",
        output: [],
        outputLine: 10,
      },
      { line: 10, command: 'true', output: [], outputLine: 11 },
    ]);
  });

  it('refuses a README without a marked block', () => {
    expect(() => parseQuickstart('# title\n```console\n$ x\n```\n')).toThrow(/no block marked/);
  });

  it("reads the README's own quick start: commands with their outputs, no lease.json, no sed", () => {
    const steps = parseQuickstart(readFileSync('README.md', 'utf8'));
    expect(steps[0]?.command).toMatch(/^npm run -s status/);
    expect(steps.filter((s) => s.output.length > 0).length).toBeGreaterThan(5);
    expect(steps.map((s) => s.command).join('\n')).not.toMatch(/lease\.json|sed -i|px-/);
  });
});

describe('the shape comparison', () => {
  it('normalises ids, credentials, ports, names, addresses, latencies, durations and times', () => {
    expect(
      normaliseLine(
        '{"id":"ba80b2ab-7651-48cd-acc8-3f73c11e5a39","url":"http://lease-ba80b2ab-7651-48cd-acc8-3f73c11e5a39:gx_a-9@127.0.0.1:23194","port":23194,"expiresAt":"2026-12-02T10:11:44.137Z"}',
      ),
    ).toBe(
      '{"id":"<uuid>","url":"http://lease-<uuid>:<password>@127.0.0.1:<port>","port":<port>,"expiresAt":"<time>"}',
    );
    expect(
      normaliseLine(
        'crawl      demo-q9zt4  Ready  127.0.0.1:23160  127.0.0.4  yes      15ms  example.com 10m',
      ),
    ).toBe('crawl  demo-<id>  Ready  127.0.0.1:<port>  127.0.0.<n>  yes  <n>ms  example.com <dur>');
    // The example's own ports and other words stay.
    expect(normaliseLine('curl http://127.0.0.1:8090/generate_204 local-2')).toBe(
      'curl http://127.0.0.1:8090/generate_204 local-<n>',
    );
  });

  it('names the README line of a difference, and of missing or extra lines', () => {
    expect(compareOutput(['204'], '204\n', 10)).toEqual([]);
    expect(compareOutput(['204'], '407\n', 10)).toEqual([{ line: 10, expected: '204', actual: '407' }]);
    expect(compareOutput(['a', 'b'], 'a\n', 10)).toEqual([
      { line: 11, expected: 'b', actual: '(no more lines)' },
    ]);
    expect(compareOutput([], 'oops\n', 10)).toEqual([
      { line: 10, expected: '(no more lines)', actual: 'oops' },
    ]);
  });

  it('in a status table, requires some cooldown exactly where the README shows some, on any row', () => {
    const header = 'NAMESPACE  NAME     PHASE  COOLDOWNS';
    const readme = [header, 'crawl      local-1  Ready  -', 'crawl      local-2  Ready  example.com 10m'];
    expect(
      compareOutput(
        readme,
        `${header}\ncrawl  local-1  Ready  example.com 9m\ncrawl  local-2  Ready  -\n`,
        1,
      ),
    ).toEqual([]);
    expect(
      compareOutput(readme, `${header}\ncrawl  local-1  Ready  -\ncrawl  local-2  Ready  -\n`, 1),
    ).toEqual([{ line: 1, expected: '1 row(s) with COOLDOWNS', actual: '0 row(s) with COOLDOWNS' }]);
  });
});
