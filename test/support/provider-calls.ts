/**
 * test/support/provider-calls — the arguments every provider test passes: a call context that
 * logs nowhere, and a CreateRequest for a named instance with credentials worth looking for in
 * logs (long and unique, so a leak cannot hide behind a common word).
 */

import type { Credentials } from '../../src/api/credentials.ts';
import { silentLogger } from '../../src/log/index.ts';
import type { CallContext, CreateRequest } from '../../src/provider/contract.ts';

export const TEST_CREDENTIALS: Credentials = { username: 'crawler', password: 's3cret-Pa55word-xyz' };

export function callContext(signal: AbortSignal = new AbortController().signal): CallContext {
  return { signal, log: silentLogger() };
}

/** Instance `name` for Proxy `crawl/<name>` with UID `uid-<name>`, on port 3128. */
export function createRequest(name: string, extra: Partial<CreateRequest> = {}): CreateRequest {
  return {
    name,
    uid: `uid-${name}`,
    namespace: 'crawl',
    proxyName: name,
    port: 3128,
    credentials: TEST_CREDENTIALS,
    ...extra,
  };
}
