/**
 * dashboard/object-events — events read off Proxy watch events: added, deleted, phase changes
 * (with the status message), a replacement starting and the switch to it, and a new egress IP.
 * Only names, phases, instance names and addresses are quoted; never a Secret or a spec field.
 */
import type { ProxyObject } from '../api/proxy.ts';
import type { WatchEvent } from '../runtime/store.ts';
import type { DerivedEvent } from './snapshot-events.ts';

/** Status messages are written by the operator; the bound keeps one event readable. */
const MAX_MESSAGE = 240;

function keyOf(p: ProxyObject): string {
  return `${p.metadata.namespace ?? ''}/${p.metadata.name}`;
}

function clip(s: string): string {
  return s.length > MAX_MESSAGE ? `${s.slice(0, MAX_MESSAGE - 1)}…` : s;
}

export function providerOf(p: ProxyObject): string | null {
  if (p.spec.type === 'External') return 'external';
  return p.spec.provider ?? null;
}

export function objectEvents(e: WatchEvent<ProxyObject>): DerivedEvent[] {
  const p = e.object;
  const proxy = keyOf(p);
  if (e.type === 'ADDED')
    return [{ kind: 'added', proxy, message: `added (provider ${providerOf(p) ?? '–'})` }];
  if (e.type === 'DELETED') return [{ kind: 'deleted', proxy, message: 'deleted' }];
  const old = e.old;
  if (!old) return [];
  const out: DerivedEvent[] = [];
  const [was, is] = [old.status, p.status];
  if ((was?.phase ?? 'Pending') !== (is?.phase ?? 'Pending')) {
    const detail = is?.message ? `: ${is.message}` : '';
    out.push({
      kind: 'phase',
      proxy,
      message: clip(`${was?.phase ?? 'Pending'} → ${is?.phase ?? 'Pending'}${detail}`),
    });
  }
  if (is?.pending && is.pending.providerID !== was?.pending?.providerID) {
    out.push({
      kind: 'replacing',
      proxy,
      message: `replacement instance ${is.pending.instanceName} started`,
    });
  }
  if (was?.instanceName && is?.instanceName && was.instanceName !== is.instanceName) {
    out.push({
      kind: 'replaced',
      proxy,
      message: `now served by ${is.instanceName} (was ${was.instanceName})`,
    });
  }
  if (is?.egressIP && is.egressIP !== was?.egressIP) {
    out.push({
      kind: 'egress-ip',
      proxy,
      message: was?.egressIP ? `egress IP ${is.egressIP} (was ${was.egressIP})` : `egress IP ${is.egressIP}`,
    });
  }
  return out;
}
