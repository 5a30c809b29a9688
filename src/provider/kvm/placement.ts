/**
 * provider/kvm/placement — where a create request lands: the kvm host its placement.zone names
 * (or the only host), and the machine type (or the only one); anything else is Permanent.
 */
import type { kvmWithDefaults } from '../../config/defaults.ts';
import type { CreateRequest } from '../contract.ts';
import { permanent } from '../errors.ts';

export type Settings = ReturnType<typeof kvmWithDefaults>;
export type Host = Settings['hosts'][number];
export type MachineType = Settings['machineTypes'][string];

export function resolveHost(provider: string, hosts: Settings['hosts'], req: CreateRequest): Host {
  const where = { op: 'create', provider };
  if (req.zone === undefined || req.zone === '') {
    const only = hosts.length === 1 ? hosts[0] : undefined;
    if (!only) {
      throw permanent(
        `${provider} create ${req.name}: placement.zone must name one of the kvm hosts (${hosts.map((h) => h.name).join(', ')})`,
        where,
      );
    }
    return only;
  }
  const h = hosts.find((x) => x.name === req.zone);
  if (!h) {
    throw permanent(
      `${provider} create ${req.name}: placement.zone ${JSON.stringify(req.zone)} is not a configured kvm host (${hosts.map((x) => x.name).join(', ')})`,
      where,
    );
  }
  return h;
}

export function resolveMachineType(
  provider: string,
  types: Settings['machineTypes'],
  req: CreateRequest,
  where: { op: string; provider: string; providerID: string },
): MachineType {
  const keys = Object.keys(types);
  const key = req.machineType || (keys.length === 1 ? keys[0] : undefined);
  const mt = key === undefined ? undefined : types[key];
  if (!mt) {
    throw permanent(
      `${provider} create ${req.name}: placement.machineType ${JSON.stringify(req.machineType ?? '')} must be one of kvm.machineTypes (${keys.join(', ')})`,
      where,
    );
  }
  return mt;
}
