/**
 * test/support/fake-gce-power — the power operations of the fake Compute Engine
 * (test/support/fake-gce): `instances.stop` and `instances.start`, and booting an inserted
 * instance. Like GCE, a stop releases the ephemeral external IP (`accessConfigs[0].natIP`) and
 * ends TERMINATED with `lastStopTimestamp`; a start passes STAGING and ends RUNNING with a new
 * natIP and `lastStartTimestamp`. New addresses come from `nextNatIP`, on loopback by default
 * (127.1.0.x), so anything a test points at them stays on this machine.
 */
import type { Json } from './fake-gce-json.ts';

/** The external IP of the first access config, if any. */
export function natIPOf(inst: Json): string | undefined {
  const ac = accessConfig(inst);
  return typeof ac?.natIP === 'string' ? ac.natIP : undefined;
}

function accessConfig(inst: Json): Json | undefined {
  const nic = (inst.networkInterfaces as Json[] | undefined)?.[0];
  return (nic?.accessConfigs as Json[] | undefined)?.[0];
}

function setNatIP(inst: Json, natIP: string | undefined): void {
  const ac = accessConfig(inst);
  if (!ac) return;
  if (natIP === undefined) delete ac.natIP;
  else ac.natIP = natIP;
}

/** Loopback addresses 127.1.0.1, 127.1.0.2, …: a fresh one per start. */
export function loopbackNatIPs(): () => string {
  let n = 0;
  return () => {
    n += 1;
    return `127.1.${Math.floor(n / 250)}.${(n % 250) + 1}`;
  };
}

/**
 * What a power call does to `inst` now and when its operation ends: `begin` runs at once,
 * `end(failed)` when the operation is DONE (a failed one leaves the status as it was before).
 */
export function powerTransition(
  action: 'stop' | 'start',
  inst: Json,
  nextNatIP: () => string,
): { begin(): void; end(failed: boolean): void } {
  const before = inst.status;
  if (action === 'stop') {
    return {
      begin: () => {
        if (before === 'RUNNING' || before === 'STAGING') inst.status = 'STOPPING';
      },
      end: (failed) => {
        if (failed) {
          inst.status = before;
          return;
        }
        if (before === 'TERMINATED') return; // stopping a stopped VM changes nothing
        inst.status = 'TERMINATED';
        setNatIP(inst, undefined);
        inst.lastStopTimestamp = new Date().toISOString();
      },
    };
  }
  return {
    begin: () => {
      if (before === 'TERMINATED' || before === 'STOPPED') inst.status = 'STAGING';
    },
    end: (failed) => {
      if (failed) {
        inst.status = before;
        return;
      }
      if (before === 'RUNNING') return; // starting a running VM changes nothing
      boot(inst, nextNatIP);
    },
  };
}

/** The instance runs, with a new external IP. */
export function boot(inst: Json, nextNatIP: () => string): void {
  inst.status = 'RUNNING';
  setNatIP(inst, nextNatIP());
  inst.lastStartTimestamp = new Date().toISOString();
}
