/**
 * cmd/listeners — the operator's own listeners and the flag that moves each, in one table: an
 * egress refusal names the listener a lease holder reached (provider/local/egress), and a
 * start-up failure to listen names the flag to change (docs/standalone.md, "Listeners").
 */
import { errorMessage } from '../log/errors.ts';
import { StartupError } from './startup.ts';

export type ListenerKey = 'discovery' | 'metrics' | 'healthProbe' | 'gateway';

/** What each listener is and the flag that sets its address. */
export const LISTENERS: Readonly<Record<ListenerKey, { name: string; flag: string }>> = {
  discovery: { name: 'discovery API', flag: '--discovery-bind-address' },
  metrics: { name: 'metrics endpoint', flag: '--metrics-bind-address' },
  healthProbe: { name: 'health probe endpoint', flag: '--health-probe-bind-address' },
  gateway: { name: 'gateway', flag: '--gateway-bind-address' },
};

/** `discovery API (--discovery-bind-address)`: how a refusal names an own port. */
export function describeListener(key: ListenerKey): string {
  const l = LISTENERS[key];
  return `${l.name} (${l.flag})`;
}

/**
 * A listen failure as the user must fix it: the address, why, and the flag that moves it. A port
 * in use or not permitted gets a hint; anything else keeps the system's message.
 */
export function listenFailure(key: ListenerKey, address: string, err: unknown): StartupError {
  const l = LISTENERS[key];
  const code = (err as NodeJS.ErrnoException | undefined)?.code;
  const why =
    code === 'EADDRINUSE'
      ? `${address} is already in use (another copy of the operator, or another program?)`
      : code === 'EACCES'
        ? `${address} is not permitted (a port below 1024 needs privileges)`
        : code === 'EADDRNOTAVAIL'
          ? `${address} is not an address of this machine`
          : `${address}: ${errorMessage(err)}`;
  return new StartupError(`${l.name} cannot listen: ${why}; choose another address with ${l.flag}`, {
    cause: err,
  });
}
