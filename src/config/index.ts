/**
 * config — the providers config: its shape, defaults, validation and loading.
 */
export * from './defaults.ts';
export * from './egress.ts';
export { type LoadOptions, loadProvidersConfig, ProvidersConfigError, parseProvidersConfig } from './load.ts';
export * from './schema.ts';
export {
  type ConfigIssue,
  formatConfigIssues,
  isCidr,
  isHostPort,
  KVM_IDENTIFIER,
  type ProvidersConfigResult,
  validateProvidersConfig,
} from './validate.ts';
