/**
 * runtime/objects — the shared Kubernetes object-semantics engine (see engine.ts) and the
 * ObjectStore adapter on top of it.
 */
export * from './engine.ts';
export * from './store-adapter.ts';
export * from './types.ts';
