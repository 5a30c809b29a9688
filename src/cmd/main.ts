#!/usr/bin/env node
/**
 * cmd/main — the executable: parse the command line, then hand over to the composition root
 * (standalone / operator), the status printer or the config check. Bad flags or config fail fast with one line.
 */
// First: the V8 settings must be in place before the rest of the program allocates anything.
import '../runtime/v8-flags.ts';
import { readFileSync } from 'node:fs';
import { pathToFileURL } from 'node:url';
import { FlagError, helpText, parseCommandLine } from './flags.ts';

function version(): string {
  const pkg = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as {
    version: string;
  };
  return pkg.version;
}

export async function main(argv: string[]): Promise<number> {
  let parsed: ReturnType<typeof parseCommandLine>;
  try {
    parsed = parseCommandLine(argv);
  } catch (err) {
    if (err instanceof FlagError) {
      process.stderr.write(`egress-proxies-operator: ${err.message}\n`);
      return 2;
    }
    throw err;
  }
  switch (parsed.command) {
    case 'help':
      process.stdout.write(`${helpText(parsed.topic)}\n`);
      return 0;
    case 'version':
      process.stdout.write(`egress-proxies-operator ${version()}\n`);
      return 0;
    case 'status': {
      const { runStatus } = await import('./status.ts');
      return runStatus(parsed.flags);
    }
    case 'check-config': {
      const { checkProvidersConfig } = await import('./check-config.ts');
      return checkProvidersConfig(parsed.providersConfig);
    }
    case 'standalone':
    case 'operator': {
      const { runServer } = await import('./compose.ts');
      return runServer(parsed, version());
    }
  }
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  main(process.argv.slice(2)).then(
    (code) => {
      process.exitCode = code;
    },
    (err: unknown) => {
      process.stderr.write(`egress-proxies-operator: ${err instanceof Error ? err.message : String(err)}\n`);
      process.exitCode = 1;
    },
  );
}
