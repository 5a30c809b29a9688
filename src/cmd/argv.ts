/**
 * cmd/argv — turning argv into flag values: Node's parseArgs plus Go-style booleans
 * (`--flag=true|false`), with every refusal a FlagError naming the flag.
 */
import { parseArgs } from 'node:util';

export class FlagError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'FlagError';
  }
}

export type Values = Record<string, string | boolean | undefined>;

/** What `--flag=<value>` may say for a boolean flag: exactly what Go's flag package accepts. */
const BOOL_VALUES: Record<string, boolean> = {
  true: true,
  True: true,
  TRUE: true,
  t: true,
  T: true,
  '1': true,
  false: false,
  False: false,
  FALSE: false,
  f: false,
  F: false,
  '0': false,
};

export type OptionTable = Record<string, { type: 'string' | 'boolean'; short?: string }>;

/**
 * Node's parseArgs refuses `--flag=value` for a boolean, but Go-style command lines (copied
 * from controller-runtime deployments) say `--leader-elect=true`. Every boolean `--flag=value`
 * is taken out of argv here and its value checked; bare `--flag` counts as true, and the last
 * mention wins, as in Go. Arguments after `--` are left alone (and rejected as positionals).
 */
function takeBooleans(
  args: string[],
  options: OptionTable,
): { rest: string[]; bools: Record<string, boolean> } {
  const rest: string[] = [];
  const bools: Record<string, boolean> = {};
  for (let i = 0; i < args.length; i++) {
    const arg = args[i] as string;
    if (arg === '--') {
      rest.push(...args.slice(i));
      break;
    }
    const m = /^--([^=]+)(?:=(.*))?$/s.exec(arg);
    const name = m?.[1];
    if (!m || name === undefined || options[name]?.type !== 'boolean') {
      rest.push(arg);
      continue;
    }
    const text = m[2];
    if (text === undefined) {
      bools[name] = true;
      continue;
    }
    const value = BOOL_VALUES[text];
    if (value === undefined) {
      throw new FlagError(`--${name}: ${JSON.stringify(text)} is not a boolean (use true or false)`);
    }
    bools[name] = value;
  }
  return { rest, bools };
}

export function parse(args: string[], options: OptionTable) {
  const { rest, bools } = takeBooleans(args, options);
  try {
    const parsed = parseArgs({ args: rest, options, allowPositionals: false, strict: true });
    return { values: { ...(parsed.values as Values), ...bools } };
  } catch (err) {
    const msg = err instanceof Error ? err.message : String(err);
    throw new FlagError(msg.replace(/^Unknown option '(.+?)'.*$/s, 'unknown flag $1 (see --help)'));
  }
}
