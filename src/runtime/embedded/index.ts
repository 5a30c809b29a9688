/**
 * runtime/embedded — the standalone (no Kubernetes) ObjectStore: manifests in, journaled state
 * file out. See store.ts and docs/standalone.md.
 */
export { type AppliedManifest, readState, STATE_FORMAT, StateFileError } from './journal.ts';
export { acquireLock, type Lock, StateLockedError } from './lock.ts';
export {
  DEFAULT_NAMESPACE,
  formatManifestError,
  type ManifestError,
  type ProxyValidator,
  parseManifestText,
} from './manifests.ts';
export { createEmbeddedStore, type EmbeddedStore, type EmbeddedStoreOptions } from './store.ts';
