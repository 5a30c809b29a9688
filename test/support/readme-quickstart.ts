/**
 * test/support/readme-quickstart — reads the runnable quick start out of README.md and compares
 * what its commands print with what the README shows, by shape: the blocks to run follow an
 * `<!-- quickstart … -->` comment and are `console` blocks, where a line `$ cmd` (continued by
 * lines after a trailing `\`) is a command, `# …` is a comment, and the lines up to the next
 * command or comment are its output. Values that differ from run to run (ids, credentials,
 * ports, pool member names, egress addresses, latencies, durations, times, column widths) are
 * normalised on both sides; everything else must be equal, line for line.
 */

/** One `$` command of the quick start and the output the README shows for it. */
export interface QuickstartStep {
  /** 1-based line of README.md where the command starts. */
  line: number;
  /** The command as pasted into a shell (continuation lines included). */
  command: string;
  /** The README's output lines (trailing blank lines removed). */
  output: string[];
  /** 1-based line of the first output line (the line after the command when there is none). */
  outputLine: number;
}

const MARKER = /^<!--\s*quickstart\b/;

/** The commands of every block marked `<!-- quickstart -->`, in order. */
export function parseQuickstart(markdown: string): QuickstartStep[] {
  const lines = markdown.split('\n');
  const steps: QuickstartStep[] = [];
  let blocks = 0;
  for (let i = 0; i < lines.length; i++) {
    if (!MARKER.test(lines[i] ?? '')) continue;
    const fence = lines[i + 1] ?? '';
    if (!/^```console\s*$/.test(fence))
      throw new Error(`README.md:${i + 2}: a quickstart marker must be followed by a \`\`\`console block`);
    blocks++;
    let current: QuickstartStep | undefined;
    let inCommand = false;
    let j = i + 2;
    for (; j < lines.length && !/^```\s*$/.test(lines[j] ?? ''); j++) {
      const text = lines[j] ?? '';
      if (inCommand && current) {
        current.command += `\n${text}`;
        inCommand = text.endsWith('\\');
        current.outputLine = j + 2;
      } else if (text.startsWith('$ ')) {
        current = { line: j + 1, command: text.slice(2), output: [], outputLine: j + 2 };
        steps.push(current);
        inCommand = text.endsWith('\\');
      } else if (text.startsWith('#')) {
        current = undefined;
      } else if (current) {
        current.output.push(text);
      } else if (text.trim() !== '') {
        throw new Error(`README.md:${j + 1}: output without a command before it: ${text}`);
      }
    }
    if (j === lines.length) throw new Error(`README.md:${i + 2}: the quickstart block is not closed`);
    i = j;
  }
  if (blocks === 0) throw new Error('README.md: no block marked <!-- quickstart -->');
  for (const s of steps) while (s.output.length > 0 && s.output.at(-1)?.trim() === '') s.output.pop();
  return steps;
}

const UUID = '[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}';
/** The ports the example names itself (lease API, health probes, gateway): kept as they are. */
const FIXED_PORTS = new Set(['8090', '8081', '8888']);

/** One line with the values that change from run to run replaced by placeholders. */
export function normaliseLine(line: string): string {
  return (
    line
      .replace(/(lease-<uuid>|lease-[0-9a-f-]{36}):[^@\s"]+@/g, '$1:<password>@')
      .replace(new RegExp(UUID, 'g'), '<uuid>')
      .replace(/\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z/g, '<time>')
      .replace(/127\.0\.0\.1:(\d+)/g, (all, port: string) =>
        FIXED_PORTS.has(port) ? all : '127.0.0.1:<port>',
      )
      .replace(/("port":\s*)\d+/g, '$1<port>')
      // The egress addresses of the example (127.0.0.2–4): which proxy gets which varies.
      .replace(/\b127\.0\.0\.[2-9]\b/g, '127.0.0.<n>')
      .replace(/\bdemo-[a-z0-9]{5}\b/g, 'demo-<id>')
      // Which eu proxy a lease gets depends on their latencies.
      .replace(/\blocal-\d+\b/g, 'local-<n>')
      .replace(/\b\d+ms\b/g, '<n>ms')
      .replace(/\b\d+[smh]\b/g, '<dur>')
      // Column widths follow the values: any run of two or more spaces inside a line is one gap.
      .replace(/(\S) {2,}(?=\S)/g, '$1  ')
      .trimEnd()
  );
}

/** A difference: the README line (1-based), what it shows and what the command printed. */
export interface Mismatch {
  line: number;
  expected: string;
  actual: string;
}

const STATUS_HEADER = /^NAMESPACE {2,}NAME {2,}PHASE\b/;

/**
 * A status table row without its COOLDOWNS cell (the last), and whether it had one: which rows
 * cool down after a block depends on which proxies share the blocked one's address.
 */
function splitCooldowns(normalised: string): { row: string; cooling: boolean } {
  const cells = normalised.split('  ');
  const last = cells.pop() ?? '';
  return { row: [...cells, '<cooldowns>'].join('  '), cooling: last !== '-' };
}

/**
 * Compares a command's output with the README's, by shape. `firstLine`: the README line of the
 * first expected output line. Returns the differences (empty when equal).
 */
export function compareOutput(expected: string[], actualText: string, firstLine: number): Mismatch[] {
  const actual = actualText.replace(/\n+$/, '').split('\n');
  if (actualText.trim() === '') actual.length = 0;
  const table = STATUS_HEADER.test(expected[0] ?? '');
  const out: Mismatch[] = [];
  let expectedCooling = 0;
  let actualCooling = 0;
  for (let i = 0; i < Math.max(expected.length, actual.length); i++) {
    const e = expected[i];
    const a = actual[i];
    let ne = e === undefined ? undefined : normaliseLine(e);
    let na = a === undefined ? undefined : normaliseLine(a);
    if (table && i > 0 && ne !== undefined && na !== undefined) {
      const se = splitCooldowns(ne);
      const sa = splitCooldowns(na);
      if (se.cooling) expectedCooling++;
      if (sa.cooling) actualCooling++;
      ne = se.row;
      na = sa.row;
    }
    if (ne !== na)
      out.push({
        line: firstLine + Math.min(i, expected.length),
        expected: e ?? '(no more lines)',
        actual: a ?? '(no more lines)',
      });
  }
  if (table && out.length === 0 && expectedCooling > 0 !== actualCooling > 0)
    out.push({
      line: firstLine,
      expected: `${expectedCooling} row(s) with COOLDOWNS`,
      actual: `${actualCooling} row(s) with COOLDOWNS`,
    });
  return out;
}
