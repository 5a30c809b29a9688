/**
 * kube-server — the stateful Kubernetes REST test server (see server.ts).
 */
export * from './server.ts';
export * from './status.ts';
