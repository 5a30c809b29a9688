/**
 * provider — the public face of the provider layer: the contract, the error classes, the
 * registry that builds providers from config and the decorators it applies.
 */
export * from './contract.ts';
export * from './decorators.ts';
export * from './errors.ts';
export * from './registry.ts';
