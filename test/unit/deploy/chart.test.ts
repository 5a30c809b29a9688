/**
 * The Helm chart's files that need no helm to check: the generated values schema matches its
 * source (run `npm run generate` after changing src/config/schema.ts), it takes its providers
 * config schema from the manager's, and the default providers config the chart ships is one the
 * manager accepts. helm lint, helm template against config/default and the chart on the real
 * API server: test/e2e/kube/helm.test.ts.
 */
import { readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { describe, expect, it } from 'vitest';
import YAML from 'yaml';
import {
  CHART_DIR,
  CHART_VALUES_SCHEMA,
  chartValuesSchema,
  renderChartValuesSchema,
} from '../../../scripts/chart-values-schema.ts';
import { validateProvidersConfig } from '../../../src/config/validate.ts';

const ROOT = resolve(import.meta.dirname, '../../..');
const values = YAML.parse(readFileSync(join(ROOT, CHART_DIR, 'values.yaml'), 'utf8')) as Record<
  string,
  unknown
>;

describe('charts/egress-proxies-operator', () => {
  it('values.schema.json is the generated one (run `npm run generate`)', () => {
    expect(readFileSync(join(ROOT, CHART_VALUES_SCHEMA), 'utf8')).toBe(renderChartValuesSchema());
  });

  it('checks providersConfig with the schema the manager reads its file with', () => {
    const schema = chartValuesSchema() as { properties: { providersConfig: { properties: object } } };
    expect(Object.keys(schema.properties.providersConfig.properties)).toEqual(['providers', 'gateway']);
    // Every top-level value is in the schema, which refuses others (a typo is an error, not ignored).
    expect(Object.keys(values).sort()).toEqual(Object.keys(schema.properties).sort());
  });

  it('ships a default providers config the manager accepts, the same as config/manager', () => {
    const result = validateProvidersConfig(values.providersConfig);
    expect(result.ok ? [] : result).toEqual([]);
    const shipped = YAML.parse(readFileSync(join(ROOT, 'config/manager/providers.yaml'), 'utf8'));
    expect(values.providersConfig).toEqual(shipped);
  });
});
