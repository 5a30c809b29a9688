/**
 * dashboard/assets — the files the page loads, read once at start: the page script's modules
 * from web/ (TypeScript with its types stripped when running from source, the compiled .js in
 * the built package) and the stylesheet. Served from this fixed map, so no request path ever
 * reaches the file system.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { stripTypeScriptTypes } from 'node:module';
import { join } from 'node:path';
import { PAGE_CSS, pageHtml } from './page.ts';

export interface Asset {
  body: string;
  contentType: string;
}

export interface DashboardAssets {
  /** The HTML of `GET /`. */
  page: string;
  /** By file name under `/dashboard/`. */
  files: ReadonlyMap<string, Asset>;
}

const JS = 'text/javascript; charset=utf-8';
const WEB_DIR = join(import.meta.dirname, 'web');

/**
 * Node's type stripping (erasable syntax only, as the whole code base). It announces itself as
 * experimental once per process; that warning would read as a fault in the operator's log at
 * every start, so exactly that one is kept quiet.
 */
function stripTypes(source: string): string {
  const emit = process.emitWarning;
  process.emitWarning = ((warning: string | Error, ...rest: unknown[]) => {
    const text = typeof warning === 'string' ? warning : warning.message;
    if (!text.startsWith('stripTypeScriptTypes'))
      (emit as (...a: unknown[]) => void).call(process, warning, ...rest);
  }) as typeof process.emitWarning;
  try {
    return stripTypeScriptTypes(source, { mode: 'strip' });
  } finally {
    process.emitWarning = emit;
  }
}

/** Reads web/: `.js` files as they are (compiled), `.ts` ones stripped; declarations and maps skipped. */
export function loadDashboardAssets(dir = WEB_DIR): DashboardAssets {
  const files = new Map<string, Asset>([
    ['app.css', { body: PAGE_CSS, contentType: 'text/css; charset=utf-8' }],
  ]);
  for (const name of readdirSync(dir).sort()) {
    if (name.endsWith('.d.ts')) continue;
    if (name.endsWith('.js'))
      files.set(name, { body: readFileSync(join(dir, name), 'utf8'), contentType: JS });
    else if (name.endsWith('.ts'))
      files.set(name, { body: stripTypes(readFileSync(join(dir, name), 'utf8')), contentType: JS });
  }
  const entry = files.has('app.js') ? 'app.js' : 'app.ts';
  if (!files.has(entry)) throw new Error(`dashboard: no app.ts or app.js in ${dir}`);
  return { page: pageHtml(entry), files };
}
