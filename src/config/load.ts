/**
 * config/load — reads the providers config file (YAML or JSON), validates it and either returns
 * it or throws one error listing every problem. Warnings go to the logger; they never stop the
 * operator. This is the only place the file is read, so a bad file fails fast at startup.
 */
import { readFile } from 'node:fs/promises';
import type { Logger } from 'pino';
import { parseDocument } from 'yaml';
import { silentLogger } from '../log/index.ts';
import { expandEgressAddresses, unbindableAddresses } from './egress-addresses.ts';
import type { ProvidersConfig } from './schema.ts';
import { type ConfigIssue, entryLabel, formatConfigIssues, validateProvidersConfig } from './validate.ts';

/** A providers config that cannot be used; `issues` holds every problem, `message` lists them. */
export class ProvidersConfigError extends Error {
  readonly file: string;
  readonly issues: ConfigIssue[];
  constructor(file: string, issues: ConfigIssue[]) {
    super(`invalid providers config ${file}:\n${formatConfigIssues(issues)}`);
    this.name = 'ProvidersConfigError';
    this.file = file;
    this.issues = issues;
  }
}

export interface LoadOptions {
  /** Where config warnings go (they never fail the load). Default: nowhere. */
  log?: Logger;
  /** Same as `log`; `log` wins when both are given. */
  logger?: Logger;
}

/** Parses YAML text (JSON is YAML too); syntax errors carry their line and column. */
export function parseProvidersConfig(text: string, file = '<providers config>'): unknown {
  const doc = parseDocument(text, { prettyErrors: true, uniqueKeys: true });
  if (doc.errors.length > 0) {
    throw new ProvidersConfigError(
      file,
      doc.errors.map((e) => ({ path: '', message: `YAML: ${e.message.split('\n')[0]}` })),
    );
  }
  return doc.toJS();
}

/**
 * Reads, parses and validates the providers config at `path`. Throws ProvidersConfigError (all
 * problems at once) or the file system error when the file cannot be read.
 */
export async function loadProvidersConfig(path: string, opts: LoadOptions = {}): Promise<ProvidersConfig> {
  const logger = opts.log ?? opts.logger ?? silentLogger();
  const text = await readFile(path, 'utf8');
  const result = validateProvidersConfig(parseProvidersConfig(text, path));
  for (const w of result.warnings) logger.warn({ file: path, field: w.path }, `WARNING: ${w.message}`);
  if (!result.ok) throw new ProvidersConfigError(path, result.errors);
  const onHost = await hostIssues(result.value);
  if (onHost.length > 0) throw new ProvidersConfigError(path, onHost);
  return result.value;
}

/** Shown per address up to this many; a /64 gone wrong must not print thousands of lines. */
const LISTED_ADDRESSES = 10;

/**
 * What only this machine can tell: `local.egressAddresses` this host cannot bind (not on any
 * interface, no local route). The local proxies run in this process, so the check is honest
 * here; each problem names the addresses and the fix.
 */
export async function hostIssues(config: ProvidersConfig): Promise<ConfigIssue[]> {
  const issues: ConfigIssue[] = [];
  for (const [i, entry] of config.providers.entries()) {
    const spec = entry.type === 'local' ? entry.local?.egressAddresses : undefined;
    if (spec === undefined) continue;
    const addresses = expandEgressAddresses(spec);
    const bad = await unbindableAddresses(addresses);
    if (bad.length === 0) continue;
    const path = `providers[${i}].local.egressAddresses`;
    const fix = (what: string) =>
      `add ${what} to an interface or route ${what} to this host (docs/providers/local.md, "Many egress IPs")`;
    if (Array.isArray(spec)) {
      for (const b of bad.slice(0, LISTED_ADDRESSES)) {
        const at = addresses.indexOf(b.address);
        issues.push({
          path: `${path}[${at}]`,
          message: `${entryLabel(i, entry)}local.egressAddresses[${at}] ${JSON.stringify(spec[at])} cannot be bound on this machine (${b.code}): ${fix('it')}`,
        });
      }
    }
    if (!Array.isArray(spec) || bad.length > LISTED_ADDRESSES) {
      const shown = bad.slice(0, LISTED_ADDRESSES).map((b) => `${b.address} (${b.code})`);
      const more = bad.length > LISTED_ADDRESSES ? `, and ${bad.length - LISTED_ADDRESSES} more` : '';
      issues.push({
        path,
        message: `${entryLabel(i, entry)}local.egressAddresses: ${bad.length} of ${addresses.length} addresses cannot be bound on this machine: ${shown.join(', ')}${more}; ${fix('them')}`,
      });
    }
  }
  return issues;
}
