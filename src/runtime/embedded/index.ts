/**
 * runtime/embedded — the standalone (no Kubernetes) ObjectStore: manifests in (manifest-sync),
 * journaled state file out (persister, journal). See store.ts and docs/standalone.md.
 */
export { StateFileError } from './journal.ts';
export { StateLockedError } from './lock.ts';
export type { ManifestError } from './manifests.ts';
export { createEmbeddedStore, type EmbeddedStore, type EmbeddedStoreOptions } from './store.ts';
