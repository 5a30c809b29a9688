/**
 * test/support/fake-gce-json — the JSON the fake Compute Engine (test/support/fake-gce) answers
 * with: instances as GCE reports them, label fingerprints, list filters and error bodies.
 */
import type { ServerResponse } from 'node:http';

export type Json = Record<string, unknown>;

const SELF = 'https://www.googleapis.com/compute/v1/projects/';

/** A new instance as GCE reports it right after insert: PROVISIONING, no external IP yet. */
export function newInstance(project: string, zone: string, name: string, id: string, resource: Json): Json {
  const nics = ((resource.networkInterfaces as Json[] | undefined) ?? [{}]).map((nic, i) => ({
    ...nic,
    kind: 'compute#networkInterface',
    name: `nic${i}`,
    networkIP: `10.128.0.${(Number(id) % 250) + 2}`,
    accessConfigs: ((nic.accessConfigs as Json[] | undefined) ?? []).map((ac) => ({
      kind: 'compute#accessConfig',
      ...ac,
    })),
  }));
  return {
    ...resource,
    kind: 'compute#instance',
    id,
    name,
    status: 'PROVISIONING',
    // GCE answers in Pacific time with an offset, not UTC.
    creationTimestamp: '2026-11-30T04:05:06.789-08:00',
    zone: `${SELF}${project}/zones/${zone}`,
    selfLink: `${SELF}${project}/zones/${zone}/instances/${name}`,
    networkInterfaces: nics,
    labelFingerprint: fingerprint(resource.labels),
  };
}

/** GCE's optimistic lock on labels: setLabels must send the fingerprint it read. */
export function fingerprint(labels: unknown): string {
  return Buffer.from(JSON.stringify(labels ?? {})).toString('base64');
}

/** The filters the provider uses: `labels.K = V`, `labels.K != V`, `labels.K:*`; else invalid. */
export function parseFilter(filter: string | null): ((inst: Json) => boolean) | 'invalid' {
  if (filter === null || filter === '') return () => true;
  const m = /^labels\.([a-z0-9_-]+)\s*(=|!=|:)\s*"?([^"]*)"?$/.exec(filter.trim());
  if (!m) return 'invalid';
  const [, key = '', op, value] = m;
  return (inst) => {
    const v = (inst.labels as Record<string, string> | undefined)?.[key];
    if (op === ':') return v !== undefined;
    return op === '=' ? v === value : v !== value;
  };
}

export function json(res: ServerResponse, status: number, body: unknown): void {
  res.writeHead(status, { 'content-type': 'application/json; charset=UTF-8' }).end(JSON.stringify(body));
}

export function error(res: ServerResponse, status: number, reason: string, message: string): void {
  json(res, status, {
    error: {
      code: status,
      message,
      errors: [{ message, domain: reason === 'notFound' ? 'global' : 'usageLimits', reason }],
    },
  });
}
