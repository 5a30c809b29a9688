/**
 * scripts/generate — writes the generated files (CRDs and their kustomization) from the TypeBox
 * schemas. Run with `npm run generate` after changing anything in src/api; the drift test in
 * test/unit/api fails until the checked-in files match.
 */
import { mkdir, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { renderCrdFiles } from '../src/api/crd.ts';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');

for (const [path, content] of Object.entries(renderCrdFiles())) {
  const target = join(root, path);
  await mkdir(dirname(target), { recursive: true });
  await writeFile(target, content);
  console.log(`wrote ${path}`);
}
