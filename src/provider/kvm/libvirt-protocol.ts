/**
 * provider/kvm/libvirt-protocol — the vocabulary of libvirt's remote protocol that the provider
 * speaks: procedure numbers, error codes and flag values from libvirt's public headers, the
 * record types the calls return, and the XDR encodings of the structures many calls share.
 */
import { LibvirtError } from './rpc.ts';
import { XdrReader, type XdrWriter } from './xdr.ts';

/** Procedure numbers (remote_procedure in src/remote/remote_protocol.x). */
export const Proc = {
  CONNECT_OPEN: 1,
  CONNECT_CLOSE: 2,
  CONNECT_GET_VERSION: 4,
  CONNECT_GET_CAPABILITIES: 7,
  DOMAIN_GET_XML_DESC: 14,
  DOMAIN_LOOKUP_BY_NAME: 23,
  CONNECT_GET_HOSTNAME: 59,
  CONNECT_SUPPORTS_FEATURE: 60,
  AUTH_LIST: 66,
  STORAGE_POOL_REFRESH: 83,
  STORAGE_POOL_LOOKUP_BY_NAME: 84,
  STORAGE_POOL_GET_INFO: 87,
  STORAGE_VOL_CREATE_XML: 93,
  STORAGE_VOL_DELETE: 94,
  STORAGE_VOL_LOOKUP_BY_NAME: 95,
  STORAGE_VOL_GET_INFO: 98,
  STORAGE_VOL_GET_XML_DESC: 99,
  STORAGE_VOL_GET_PATH: 100,
  DOMAIN_IS_ACTIVE: 150,
  STORAGE_POOL_IS_ACTIVE: 154,
  CONNECT_GET_LIB_VERSION: 157,
  DOMAIN_CREATE_WITH_FLAGS: 196,
  STORAGE_VOL_UPLOAD: 208,
  STORAGE_VOL_DOWNLOAD: 209,
  DOMAIN_GET_STATE: 212,
  DOMAIN_UNDEFINE_FLAGS: 231,
  DOMAIN_DESTROY_FLAGS: 234,
  DOMAIN_SHUTDOWN_FLAGS: 258,
  CONNECT_LIST_ALL_DOMAINS: 273,
  STORAGE_POOL_LIST_ALL_VOLUMES: 282,
  DOMAIN_DEFINE_XML_FLAGS: 350,
  DOMAIN_INTERFACE_ADDRESSES: 353,
} as const;

/** virErrorNumber values the provider branches on. */
export const ErrorCode = {
  INTERNAL_ERROR: 1,
  NO_SUPPORT: 3,
  INVALID_ARG: 8,
  OPERATION_FAILED: 9,
  XML_ERROR: 27,
  SYSTEM_ERROR: 38,
  RPC: 39,
  NO_DOMAIN: 42,
  AUTH_FAILED: 45,
  NO_STORAGE_POOL: 49,
  NO_STORAGE_VOL: 50,
  OPERATION_INVALID: 55,
  CONFIG_UNSUPPORTED: 67,
  OPERATION_TIMEOUT: 68,
  ARGUMENT_UNSUPPORTED: 74,
  OPERATION_ABORTED: 78,
  OPERATION_UNSUPPORTED: 84,
  AGENT_UNRESPONSIVE: 86,
  ACCESS_DENIED: 88,
  STORAGE_VOL_EXIST: 90,
} as const;

/** virDomainState */
export const DomainState = {
  NOSTATE: 0,
  RUNNING: 1,
  BLOCKED: 2,
  PAUSED: 3,
  SHUTDOWN: 4,
  SHUTOFF: 5,
  CRASHED: 6,
  PMSUSPENDED: 7,
} as const;

/** virStoragePoolState */
export const PoolState = { INACTIVE: 0, BUILDING: 1, RUNNING: 2, DEGRADED: 3, INACCESSIBLE: 4 } as const;

export const POOL_STATE_NAMES = ['inactive', 'building', 'running', 'degraded', 'inaccessible'] as const;

/** virDomainUndefineFlagsValues */
export const UndefineFlags = {
  MANAGED_SAVE: 1,
  SNAPSHOTS_METADATA: 2,
  NVRAM: 4,
  KEEP_NVRAM: 8,
  CHECKPOINTS_METADATA: 16,
} as const;

/** virDomainInterfaceAddressesSource */
export const AddressSource = { LEASE: 0, AGENT: 1, ARP: 2 } as const;

/** virConnectListAllDomainsFlags (subset) */
export const ListDomainsFlags = { ACTIVE: 1, INACTIVE: 2, PERSISTENT: 4, TRANSIENT: 8 } as const;

/** virDomainXMLFlags (subset) */
export const DomainXmlFlags = { SECURE: 1, INACTIVE: 2 } as const;

/** remote_auth_type */
export const AuthType = { NONE: 0, SASL: 1, POLKIT: 2 } as const;

export const FEATURE_PROGRAM_KEEPALIVE = 10;
const UUID_LEN = 16;

export interface DomainRef {
  name: string;
  uuid: Buffer;
  /** -1 while the domain is not running. */
  id: number;
}

export interface PoolRef {
  name: string;
  uuid: Buffer;
}

export interface VolRef {
  pool: string;
  name: string;
  key: string;
}

export interface PoolInfo {
  state: number;
  capacity: number;
  allocation: number;
  available: number;
}

export interface VolInfo {
  type: number;
  capacity: number;
  allocation: number;
}

export interface DomainStateInfo {
  state: number;
  reason: number;
}

export interface IpAddress {
  /** 0 = IPv4, 1 = IPv6 (virIPAddrType). */
  type: number;
  addr: string;
  prefix: number;
}

export interface DomainInterface {
  name: string;
  hwaddr: string | null;
  addrs: IpAddress[];
}

/** "9.0.0" from libvirt's packed major*1_000_000 + minor*1_000 + micro. */
export function formatVersion(v: number): string {
  return `${Math.floor(v / 1_000_000)}.${Math.floor(v / 1000) % 1000}.${v % 1000}`;
}

export function uuidString(uuid: Buffer): string {
  const h = uuid.toString('hex');
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}

export function isLibvirtError(err: unknown, code?: number): err is LibvirtError {
  return err instanceof LibvirtError && (code === undefined || err.code === code);
}

// XDR pieces shared by many calls.

export const writeDomain = (w: XdrWriter, d: DomainRef) =>
  w.string(d.name).fixedOpaque(d.uuid, UUID_LEN).int(d.id);
export const readDomain = (r: XdrReader): DomainRef => ({
  name: r.string(),
  uuid: r.fixedOpaque(UUID_LEN),
  id: r.int(),
});
export const writePool = (w: XdrWriter, p: PoolRef) => w.string(p.name).fixedOpaque(p.uuid, UUID_LEN);
export const readPool = (r: XdrReader): PoolRef => ({ name: r.string(), uuid: r.fixedOpaque(UUID_LEN) });
export const writeVol = (w: XdrWriter, v: VolRef) => w.string(v.pool).string(v.name).string(v.key);
export const readVol = (r: XdrReader): VolRef => ({ pool: r.string(), name: r.string(), key: r.string() });
export const safeNumber = (v: bigint): number =>
  v > BigInt(Number.MAX_SAFE_INTEGER) ? Number.MAX_SAFE_INTEGER : Number(v);

export function decodeAll<T>(body: Buffer, read: (r: XdrReader) => T): T {
  const r = new XdrReader(body);
  const v = read(r);
  r.end();
  return v;
}
