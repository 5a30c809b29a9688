/**
 * test/support/lease — a ProxyInfo as the lease feed would pass it for a Ready, healthy proxy,
 * with any field overridden: the one builder the lease store and discovery tests share.
 */
import type { ProxyInfo } from '../../src/lease/types.ts';

export function proxyInfo(name: string, over: Partial<ProxyInfo> = {}): ProxyInfo {
  const namespace = over.namespace ?? 'crawl';
  return {
    key: `${namespace}/${name}`,
    namespace,
    name,
    uid: `uid-${name}`,
    labels: {},
    phase: 'Ready',
    healthy: true,
    draining: false,
    deleting: false,
    maxLeases: 0,
    host: '10.0.0.1',
    port: 3128,
    ...over,
  };
}
