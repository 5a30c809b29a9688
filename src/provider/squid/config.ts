/**
 * provider/squid/config — the one squid.conf every managed proxy runs, in two profiles:
 * `pod` (a container: logs on stdout/stderr, nothing written to the read-only filesystem) and
 * `vm` (a systemd host running the distribution's squid package). The rules are the same in
 * both: authenticated forwarding only, the provider's egress policy (config/egress), no cache,
 * nothing announced to origins, an explicit file descriptor limit; only where files and logs live
 * differs.
 */
import {
  canonicalAddressText,
  type EgressPolicy,
  type OperatorEndpoints,
  resolveEgressPolicy,
} from '../../config/egress.ts';

export type SquidProfile = 'pod' | 'vm';

/** Where the Pod mounts its Secret (squid.conf + htpasswd), and the Secret's keys. */
export const SQUID_CONFIG_DIR = '/etc/squid-operator';
export const SQUID_CONFIG_KEY = 'squid.conf';
export const HTPASSWD_KEY = 'htpasswd';
/** Where the default cloud-init writes its files on a VM. */
export const VM_CONFIG_DIR = '/etc/egress-proxy';
export const VM_SQUID_CONF = `${VM_CONFIG_DIR}/squid.conf`;
export const VM_HTPASSWD = `${VM_CONFIG_DIR}/htpasswd`;
/** basic_ncsa_auth in Debian/Ubuntu Squid packages (and the ubuntu/squid image). */
export const NCSA_AUTH_HELPER = '/usr/lib/squid/basic_ncsa_auth';
/**
 * Squid sizes several tables by its fd limit; left to inherit a container runtime's huge
 * RLIMIT_NOFILE it allocates gigabytes at start and gets OOM-killed. 4096 fits a crawler proxy.
 */
export const DEFAULT_MAX_FILE_DESCRIPTORS = 4096;
export const SQUID_AUTH_REALM = 'egress-proxies-operator';
/**
 * Squid's errors for an origin it could not reach or that broke off: the proxy itself works, so
 * its answer carries `X-Proxy-Error: origin-unreachable` and the crawler must not report it
 * `failed`. (A CONNECT refused this way is a 503 whose headers most clients never show.)
 */
export const ORIGIN_FAILURES = [
  'ERR_CONNECT_FAIL',
  'ERR_DNS_FAIL',
  'ERR_READ_TIMEOUT',
  'ERR_READ_ERROR',
  'ERR_WRITE_ERROR',
  'ERR_ZERO_SIZE_OBJECT',
  'ERR_SECURE_CONNECT_FAIL',
  'ERR_GATEWAY_FAILURE',
];

interface ProfileLayout {
  htpasswd: string;
  accessLog: string;
  cacheLog: string;
  pidFilename: string;
  coredumpDir: string;
}

/**
 * Under systemd, stdout is a journal socket Squid cannot open as a file, and Debian's unit
 * expects the PID file in /run; a container has no writable place for either.
 */
const LAYOUTS: Record<SquidProfile, ProfileLayout> = {
  pod: {
    htpasswd: `${SQUID_CONFIG_DIR}/${HTPASSWD_KEY}`,
    accessLog: 'stdio:/dev/stdout',
    cacheLog: '/dev/stderr',
    pidFilename: 'none',
    coredumpDir: '/tmp',
  },
  vm: {
    htpasswd: VM_HTPASSWD,
    accessLog: 'daemon:/var/log/squid/access.log squid',
    cacheLog: '/var/log/squid/cache.log',
    pidFilename: '/run/squid.pid',
    coredumpDir: '/var/spool/squid',
  },
};

export interface SquidConfigOptions {
  profile: SquidProfile;
  port: number;
  maxFileDescriptors?: number;
  /** Default: the profile's htpasswd path. */
  htpasswdPath?: string;
  /** Default: all addresses (a Pod has only its own). Tests pin 127.0.0.1. */
  listenAddress?: string;
  /** Default NCSA_AUTH_HELPER. */
  authHelper?: string;
  /** What lease holders may reach; default: the default policy (resolveEgressPolicy()). */
  egress?: EgressPolicy;
  /** The operator's own listeners, denied whatever `egress` allows; default: none known. */
  operator?: OperatorEndpoints;
}

/**
 * The operator's own listeners as http_access rules, before every other deny and the allow:
 * (operator address AND operator port) is refused even where allowCIDRs opened the address,
 * except `GET`/`HEAD /generate_204` on the discovery port, which the rest of the policy then
 * decides as for any destination. Nothing is rendered when no address or no port is known, so
 * the file stays byte-identical for proxies that were given none.
 */
function operatorLines(op: OperatorEndpoints | undefined): string[] {
  if (!op || op.addresses.length === 0 || op.ports.length === 0) return [];
  const ports = op.probePort === undefined ? op.ports : [...op.ports, op.probePort];
  const bad = ports.find((port) => !Number.isInteger(port) || port < 1 || port > 65535);
  if (bad !== undefined) throw new Error(`operator.ports: ${JSON.stringify(bad)} is not a port (1-65535)`);
  const cidrs = op.addresses.map((a) => {
    const c = canonicalAddressText(a);
    if (c === undefined) throw new Error(`operator.addresses: ${JSON.stringify(a)} is not an IP address`);
    return `${c}/${c.includes(':') ? 128 : 32}`;
  });
  const lines = [
    "# The operator's own listeners stay closed whatever allowCIDRs opens (docs/operations.md).",
  ];
  for (let i = 0; i < cidrs.length; i += 8)
    lines.push(`acl operator_dst dst ${cidrs.slice(i, i + 8).join(' ')}`);
  lines.push(`acl operator_ports port ${op.ports.join(' ')}`);
  if (op.probePort === undefined) {
    lines.push('http_access deny operator_dst operator_ports');
    return lines;
  }
  lines.push(
    `acl operator_probe_port port ${op.probePort}`,
    'acl operator_probe_method method GET HEAD',
    'acl operator_probe_path urlpath_regex ^/generate_204$',
    'acl operator_probe all-of operator_probe_port operator_probe_method operator_probe_path',
    'http_access deny operator_dst operator_ports !operator_probe',
  );
  return lines;
}

/**
 * The egress policy as http_access rules, after authentication (an anonymous client learns
 * nothing about the policy: it gets 407 first). `dst` ACLs match the addresses Squid resolved a
 * name to — any one of them denied denies the request — and Squid connects to those same
 * addresses, so a name pointing at a denied address is refused. Each deny line ends in a
 * non-auth ACL, so Squid answers 403, not a fresh 407 challenge.
 */
function egressLines(p: EgressPolicy, operator: string[]): string[] {
  for (const [field, ports] of [
    ['egress.httpPorts', p.httpPorts],
    ['egress.connectPorts', p.connectPorts],
  ] as const) {
    const bad = ports.find((port) => !Number.isInteger(port) || port < 1 || port > 65535);
    if (bad !== undefined) throw new Error(`${field}: ${JSON.stringify(bad)} is not a port (1-65535)`);
  }
  const badRange = p.deniedCIDRs.find((c) => !CIDR_TEXT.test(c));
  if (badRange !== undefined)
    throw new Error(`egress.deniedCIDRs: ${JSON.stringify(badRange)} is not a CIDR`);
  const lines = [
    '# Egress policy: what a lease holder may reach (docs/operations.md, "Security model").',
    'acl CONNECT method CONNECT',
    'acl egress_http proto HTTP',
    `acl egress_http_ports port ${p.httpPorts.join(' ')}`,
  ];
  if (p.connectPorts.length > 0) lines.push(`acl egress_connect_ports port ${p.connectPorts.join(' ')}`);
  // Repeated acl lines add to one ACL; short lines stay far below Squid's line length limit.
  for (let i = 0; i < p.deniedCIDRs.length; i += 8) {
    lines.push(`acl egress_denied_dst dst ${p.deniedCIDRs.slice(i, i + 8).join(' ')}`);
  }
  lines.push(
    'http_access deny !authed',
    ...operator,
    p.connectPorts.length > 0 ? 'http_access deny CONNECT !egress_connect_ports' : 'http_access deny CONNECT',
    'http_access deny !CONNECT !egress_http',
    'http_access deny !CONNECT !egress_http_ports',
  );
  if (p.deniedCIDRs.length > 0) lines.push('http_access deny egress_denied_dst');
  return lines;
}

/** An address/prefix as Squid's `dst` ACL takes it: hex digits, dots and colons, then /bits. */
const CIDR_TEXT = /^[0-9A-Fa-f:.]+\/\d{1,3}$/;

/**
 * A value spliced into a squid.conf line: a line break would start a directive of its own and
 * whitespace would add arguments, so the renderer refuses both whatever validated it upstream.
 */
function confToken(field: string, value: string | undefined): void {
  if (value !== undefined && (value === '' || /[\s\p{Cc}]/u.test(value)))
    throw new Error(`${field}: must be non-empty, without whitespace or control characters`);
}

export function squidConfig(opts: SquidConfigOptions): string {
  confToken('listenAddress', opts.listenAddress);
  confToken('htpasswdPath', opts.htpasswdPath);
  confToken('authHelper', opts.authHelper);
  const fds = opts.maxFileDescriptors ?? DEFAULT_MAX_FILE_DESCRIPTORS;
  if (!Number.isInteger(opts.port) || opts.port < 1 || opts.port > 65535) {
    throw new Error(`port: ${opts.port} is not a port (1-65535)`);
  }
  if (!Number.isInteger(fds) || fds < 64)
    throw new Error(`maxFileDescriptors: ${fds} must be an integer >= 64`);
  const layout = LAYOUTS[opts.profile];
  const listen = opts.listenAddress ? `${opts.listenAddress}:${opts.port}` : String(opts.port);
  const htpasswd = opts.htpasswdPath ?? layout.htpasswd;
  return `${[
    '# Generated by egress-proxies-operator; edits are overwritten when the proxy is replaced.',
    `http_port ${listen}`,
    `max_filedescriptors ${fds}`,
    '',
    '# Every request must authenticate: a proxy on a reachable address must never be open.',
    `auth_param basic program ${opts.authHelper ?? NCSA_AUTH_HELPER} ${htpasswd}`,
    'auth_param basic children 5 startup=1 idle=1',
    `auth_param basic realm ${SQUID_AUTH_REALM}`,
    'auth_param basic credentialsttl 1 hour',
    'acl authed proxy_auth REQUIRED',
    ...egressLines(opts.egress ?? resolveEgressPolicy(), operatorLines(opts.operator)),
    'http_access allow authed',
    'http_access deny all',
    '',
    '# A forwarding proxy for crawlers: nothing is cached.',
    'cache deny all',
    'cache_mem 8 MB',
    '',
    // Both profiles carry this line as written for the pod: VMs already run with it, and the
    // generated file stays byte-identical to what they were given.
    '# Logs go to the container streams; nothing is written to the (read-only) filesystem.',
    `access_log ${layout.accessLog}`,
    `cache_log ${layout.cacheLog}`,
    'cache_store_log none',
    'logfile_rotate 0',
    `pid_filename ${layout.pidFilename}`,
    'netdb_filename none',
    'pinger_enable off',
    `coredump_dir ${layout.coredumpDir}`,
    '',
    // The file the comment names is docs/lease-api.md now; the rendered bytes stay as running
    // proxies have them, since a changed squid.conf would replace instances for a comment.
    '# Tell a crawler that the origin failed, not the proxy (docs/api.md, "What to report").',
    `acl origin_failure squid_error ${ORIGIN_FAILURES.join(' ')}`,
    'reply_header_add X-Proxy-Error "origin-unreachable" origin_failure',
    '',
    '# Do not announce the proxy or the client to origins.',
    'via off',
    'forwarded_for delete',
    'httpd_suppress_version_string on',
    'shutdown_lifetime 3 seconds',
  ].join('\n')}\n`;
}
