/**
 * api — the public face of the resource definitions: types, schemas, constants, validation and
 * CRD rendering, importable from one module.
 */
export * from './constants.ts';
export { providerHealthCrd, proxyCrd, proxyPoolCrd, renderCrdFiles } from './crd.ts';
export * from './meta.ts';
export { checkProxyPoolRules } from './pool-rules.ts';
export * from './providerhealth.ts';
export * from './proxy.ts';
export * from './proxypool.ts';
export { type CelRule, checkProxyRules, type XValidation } from './rules.ts';
export { childPath, type FieldError, formatFieldErrors, formatPath } from './schema-errors.ts';
export {
  defaultProxy,
  defaultProxyPool,
  isDnsLabel,
  isDnsSubdomain,
  type ValidationResult,
  validateProviderHealth,
  validateProxy,
  validateProxyPool,
} from './validate.ts';
