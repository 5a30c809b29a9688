/**
 * cmd/check-config — `check-config`: validates a providers config file exactly as a start does
 * (the same loader, every problem at once, naming the field) without connecting anywhere, so a
 * cluster's config can be checked before it is applied.
 */
import { loadProvidersConfig, ProvidersConfigError } from '../config/load.ts';
import { errorMessage } from '../log/errors.ts';
import { createLogger } from '../log/index.ts';

/** Prints `providers config OK` (0) or the problems (2); an unreadable file is 2 too. */
export async function checkProvidersConfig(
  path: string,
  out: NodeJS.WritableStream = process.stdout,
  err: NodeJS.WritableStream = process.stderr,
): Promise<number> {
  try {
    // Warnings (deprecated fields, …) go where a start would log them: stderr, never the verdict.
    await loadProvidersConfig(path, {
      log: createLogger({ destination: err, pretty: false, level: 'warn' }),
    });
  } catch (e) {
    err.write(
      `${e instanceof ProvidersConfigError ? e.message : `providers config ${path}: ${errorMessage(e)}`}\n`,
    );
    return 2;
  }
  out.write('providers config OK\n');
  return 0;
}
