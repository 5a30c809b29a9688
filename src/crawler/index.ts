/**
 * crawler/index — what the package exports (`import … from 'egress-proxies-operator'`): the
 * typed lease API client and the crawler-side helpers around it (docs/lease-api.md, "TypeScript").
 */
export * from '../discovery/client.ts';
export * from './lease.ts';
export * from './outcome.ts';
