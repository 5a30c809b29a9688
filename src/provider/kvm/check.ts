/**
 * provider/kvm/check — the health verdict of one KVM host over the shared connection: libvirt
 * version and hostname, then the configured pool must exist and be running. Reasons name the
 * step that failed (SSH material, TCP, SSH handshake, libvirt socket, timeout, pool, libvirt).
 */
import type { TargetCheck } from '../../api/providerhealth.ts';
import { ProviderError } from '../errors.ts';
import { ErrorCode, formatVersion, isLibvirtError, POOL_STATE_NAMES, PoolState } from './libvirt-protocol.ts';
import type { HostPool } from './pool.ts';
import { RpcConnectionError } from './rpc.ts';
import { SshError } from './ssh-error.ts';

export interface CheckHost {
  name: string;
  address: string;
  user: string;
  pool: string;
}

const MESSAGE_LIMIT = 1024;

function findSshError(err: unknown): SshError | undefined {
  const seen = new Set<unknown>();
  let e: unknown = err;
  while (e instanceof Error && !seen.has(e)) {
    if (e instanceof SshError) return e;
    seen.add(e);
    e = e.cause;
  }
  return undefined;
}

/** The check reason for an error, in the order the steps happen. */
export function checkReason(err: unknown, signal: AbortSignal): string {
  const ssh = findSshError(err);
  if (ssh) {
    if (ssh.reason === 'SSHMaterialInvalid') return 'SSHMaterialUnavailable';
    return ssh.reason;
  }
  if (signal.aborted) return 'Timeout';
  if (isLibvirtError(err, ErrorCode.NO_STORAGE_POOL)) return 'PoolNotFound';
  if (isLibvirtError(err)) return 'LibvirtError';
  if (err instanceof ProviderError && err.errorClass === 'Permanent') return 'LibvirtError';
  if (err instanceof RpcConnectionError) return 'Unreachable';
  return 'Unreachable';
}

const gib = (bytes: number) => `${(bytes / 1024 ** 3).toFixed(1)}GiB`;

/** One host's verdict; never throws. */
export async function checkHost(pool: HostPool, host: CheckHost, signal: AbortSignal): Promise<TargetCheck> {
  const start = Date.now();
  const target: TargetCheck = {
    name: host.name,
    address: host.address,
    ready: false,
    reason: 'Unreachable',
  };
  const details: Record<string, string> = { user: host.user, pool: host.pool };
  try {
    // Only raw RPCs inside the probe: the verdict is decided once they all answered.
    const r = await pool.probe(host.name, signal, async (conn) => {
      const o = { signal };
      const version = await conn.getLibVersion(o);
      const hostname = await conn.getHostname(o);
      const ref = await conn.storagePoolLookupByName(host.pool, o);
      const info = await conn.storagePoolGetInfo(ref, o);
      return { version, hostname, info };
    });
    details.hostname = r.hostname;
    details.libvirtVersion = formatVersion(r.version);
    details.poolState = POOL_STATE_NAMES[r.info.state] ?? String(r.info.state);
    details.poolCapacity = gib(r.info.capacity);
    details.poolAvailable = gib(r.info.available);
    if (r.info.state === PoolState.RUNNING) {
      target.ready = true;
      target.reason = 'Reachable';
    } else {
      target.reason = 'PoolNotActive';
      target.message = `storage pool ${host.pool} is ${details.poolState}, not running`;
    }
  } catch (err) {
    target.reason = checkReason(err, signal);
    const msg =
      target.reason === 'Timeout' && !findSshError(err) ? 'check timed out' : (err as Error).message;
    target.message = String(msg).slice(0, MESSAGE_LIMIT);
  }
  target.details = details;
  target.latencyMillis = Math.max(0, Date.now() - start);
  return target;
}
