/**
 * controller/providers — the provider a Proxy names, as the reconciler calls it: every
 * failure arrives as a ProviderError (provider/decorators `withErrorOrigin`, which the provider
 * registry already applies and which never wraps twice), so only the provider's own failures
 * turn into provider conditions, never a store or network error of ours.
 */
import type { ProxyObject } from '../api/proxy.ts';
import type { Provider } from '../provider/contract.ts';
import { withErrorOrigin } from '../provider/decorators.ts';
import type { ReconcileContext } from './context.ts';

/** The Proxy's provider, or undefined when the providers config has none by that name. */
export function lookupProvider(ctx: ReconcileContext, p: ProxyObject): Provider | undefined {
  const provider = ctx.providers.get(p.spec.provider ?? '');
  return provider && withErrorOrigin(provider);
}
