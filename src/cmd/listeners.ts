/**
 * cmd/listeners — the operator's own listeners and the flag that moves each, in one table: an
 * egress refusal names the listener a lease holder reached (provider/local/egress), and a
 * start-up failure to listen names the flag to change (docs/standalone.md, "Listeners"); and
 * where proxies reach the discovery API, for the health-check placeholder `operator.invalid`.
 */
import { isIP } from 'node:net';
import { errorMessage } from '../log/errors.ts';
import { parseBindAddress } from '../metrics/bind.ts';
import type { CommonFlags } from './flags.ts';
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

/** The bind-address flags; `gateway` only where the command has one. */
export type ListenerFlags = Pick<
  CommonFlags,
  'discoveryBindAddress' | 'metricsBindAddress' | 'healthProbeBindAddress'
> & { gateway?: { bindAddress: string } };

function bindAddressOf(flags: ListenerFlags, key: ListenerKey): string | undefined {
  switch (key) {
    case 'discovery':
      return flags.discoveryBindAddress;
    case 'metrics':
      return flags.metricsBindAddress;
    case 'healthProbe':
      return flags.healthProbeBindAddress;
    case 'gateway':
      return flags.gateway?.bindAddress;
  }
}

/**
 * A failure to listen (the error or one it was wrapped around) as a StartupError naming the
 * flag of the listener on that port, or undefined when `err` is no listen failure of ours.
 */
export function listenFailureOf(err: unknown, flags: ListenerFlags): StartupError | undefined {
  let e: unknown = err;
  for (let depth = 0; e instanceof Error && depth < 5; depth++) {
    const x = e as NodeJS.ErrnoException & { address?: string; port?: number };
    if (x.syscall === 'listen' && typeof x.port === 'number') {
      const keys = (Object.keys(LISTENERS) as ListenerKey[]).filter((k) => {
        const text = bindAddressOf(flags, k);
        return text !== undefined && parseBindAddress(text, LISTENERS[k].flag)?.port === x.port;
      });
      const key = keys[0];
      if (key === undefined) return undefined;
      const host = x.address ?? '0.0.0.0';
      const address = isIP(host) === 6 ? `[${host}]:${x.port}` : `${host}:${x.port}`;
      const failure = listenFailure(key, address, x);
      // Two listeners asked for one port: either flag resolves it.
      return keys.length === 1
        ? failure
        : new StartupError(
            `${failure.message.replace(/; choose another address with .*$/, '')}; ${keys.map((k) => LISTENERS[k].flag).join(' and ')} name the same port: change one of them`,
            { cause: x },
          );
    }
    e = e.cause;
  }
  return undefined;
}

/**
 * `host:port` at which this process's proxies reach its discovery API: the bound host, or on a
 * wildcard bind the Pod IP in a cluster (`POD_IP`) and loopback standalone. Undefined when the
 * API is off or on an ephemeral port, which the flags cannot tell.
 */
export function operatorProbeAddress(
  discoveryBindAddress: string,
  env: NodeJS.ProcessEnv,
): string | undefined {
  const bind = parseBindAddress(discoveryBindAddress, LISTENERS.discovery.flag);
  if (!bind || bind.port === 0) return undefined;
  const wildcard = bind.host === undefined || bind.host === '0.0.0.0' || bind.host === '::';
  const host = wildcard
    ? env.POD_IP?.trim() || (bind.host === '::' ? '::1' : '127.0.0.1')
    : (bind.host as string);
  return isIP(host) === 6 ? `[${host}]:${bind.port}` : `${host}:${bind.port}`;
}
