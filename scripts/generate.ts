/**
 * scripts/generate — writes the generated files from the TypeBox schemas: the CRDs and their
 * kustomization (config/crd), the chart's copy of the CRDs and the chart's values schema. Run
 * with `npm run generate` after changing anything in src/api or src/config/schema.ts; the drift
 * tests in test/unit/api and test/unit/deploy fail until the checked-in files match.
 */
import { mkdir, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { renderCrdFiles } from '../src/api/crd.ts';
import { CHART_VALUES_SCHEMA, renderChartValuesSchema } from './chart-values-schema.ts';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');

const files = { ...renderCrdFiles(), [CHART_VALUES_SCHEMA]: renderChartValuesSchema() };
for (const [path, content] of Object.entries(files)) {
  const target = join(root, path);
  await mkdir(dirname(target), { recursive: true });
  await writeFile(target, content);
  console.log(`wrote ${path}`);
}
