/**
 * scripts/docs/module-map — writes the "Module map" section at the end of docs/architecture.md
 * from the source tree: every file under src/, grouped by folder, with the first sentence of its
 * header comment. `--check` only says whether the section is current (the docs test runs it).
 */
import { readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const DOC = join(ROOT, 'docs/architecture.md');
const HEADING = '## Module map';
const MAX_SUMMARY = 180;
const FOLDER_NOTES: Record<string, string> = {
  'src/dashboard/web/': ' (the page script, run by the browser)',
};

const INTRO = `Every source file, with the first sentence of its header comment (each file states its one job
there); \`npm run docs:modules\` rewrites this section. Protocol codecs (\`kvm/rpc.ts\`, \`kvm/xdr.ts\`,
\`kvm/iso9660.ts\`) aside, no file is over about 450 lines and no function over about 120.`;

function sourceFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((d) => {
    const path = join(dir, d.name);
    if (d.isDirectory()) return sourceFiles(path);
    return d.name.endsWith('.ts') && !d.name.endsWith('.d.ts') ? [path] : [];
  });
}

/** The first sentence of a file's leading doc comment, without its `folder/name — ` prefix. */
export function summary(source: string): string {
  const m = /^(?:#!.*\n|\/\/\/.*\n|\s)*\/\*\*([\s\S]*?)\*\//.exec(source);
  if (!m?.[1]) return '(no header comment)';
  const text = m[1]
    .split('\n')
    .map((l) => l.replace(/^\s*\*\s?/, '').trim())
    .join(' ')
    .replace(/\s+/g, ' ')
    .trim()
    .replace(/^[\w./-]+ — /, '');
  const end = /\.(\s+[A-Z(`]|$)/.exec(text);
  let first = end ? text.slice(0, end.index + 1) : text;
  if (first.length > MAX_SUMMARY) first = `${first.slice(0, first.lastIndexOf(' ', MAX_SUMMARY))} …`;
  return first;
}

export function moduleMap(root = ROOT): string {
  const byFolder = new Map<string, string[]>();
  for (const file of sourceFiles(join(root, 'src')).sort()) {
    const rel = relative(root, file);
    const folder = `${rel.slice(0, rel.lastIndexOf('/') + 1)}`;
    const line = `- \`${rel.slice(folder.length)}\` — ${summary(readFileSync(file, 'utf8'))}`;
    byFolder.set(folder, [...(byFolder.get(folder) ?? []), line]);
  }
  const sections = [...byFolder.keys()]
    .sort()
    .map((folder) => `**\`${folder}\`**${FOLDER_NOTES[folder] ?? ''}\n\n${byFolder.get(folder)!.join('\n')}`);
  return `${HEADING}\n\n${INTRO}\n\n${sections.join('\n\n')}\n`;
}

/** docs/architecture.md with its module map replaced by the current one. */
export function withCurrentMap(doc: string, map = moduleMap()): string {
  const at = doc.indexOf(`\n${HEADING}\n`);
  if (at < 0) throw new Error(`docs/architecture.md has no "${HEADING}" section`);
  return `${doc.slice(0, at + 1)}${map}`;
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const doc = readFileSync(DOC, 'utf8');
  const next = withCurrentMap(doc);
  if (process.argv.includes('--check')) {
    if (next !== doc) {
      console.error('docs/architecture.md: the module map is out of date; run npm run docs:modules');
      process.exit(1);
    }
  } else if (next !== doc) {
    writeFileSync(DOC, next);
    console.log('docs/architecture.md: module map rewritten');
  }
}
