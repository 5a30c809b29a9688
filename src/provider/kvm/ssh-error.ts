/**
 * provider/kvm/ssh-error — how an SSH step fails: one SshError class whose `reason` names the
 * step (the kvm health-check reasons), and the mapping from an ssh2 handshake error to it.
 */

/** Which step failed; the values match the kvm health-check reasons. */
export type SshFailureReason =
  | 'SSHMaterialUnavailable' // key / known_hosts file missing or unreadable (may heal)
  | 'SSHMaterialInvalid' // key / known_hosts file present but unusable (won't heal by itself)
  | 'Unreachable' // TCP connect failed
  | 'SSHHandshakeFailed' // host key rejected, authentication failed, protocol error
  | 'LibvirtConnectFailed' // the streamlocal channel to libvirt-sock could not be opened
  | 'Timeout';

export class SshError extends Error {
  readonly reason: SshFailureReason;
  constructor(reason: SshFailureReason, message: string, opts?: { cause?: unknown }) {
    super(message, opts);
    this.name = 'SshError';
    this.reason = reason;
  }
}

/** Where a handshake was going, for the messages of the errors below. */
export interface HandshakeTarget {
  host: string;
  port: number;
  username: string;
}

/**
 * The SshError for an ssh2 client error during connect + handshake + auth. A host key our
 * verifier refused surfaces as a generic handshake error, so the verifier's own finding
 * (`hostKeyProblem`) takes precedence.
 */
export function handshakeError(
  err: Error & { level?: string; code?: string },
  to: HandshakeTarget,
  hostKeyProblem: string | undefined,
): SshError {
  const where = `${to.host}:${to.port}`;
  if (hostKeyProblem) {
    return new SshError('SSHHandshakeFailed', `SSH host key of ${where} rejected: ${hostKeyProblem}`);
  }
  if (err.level === 'client-socket' || err.code === 'ECONNREFUSED' || err.code === 'EHOSTUNREACH') {
    return new SshError('Unreachable', `cannot reach ${where}: ${err.message}`, { cause: err });
  }
  if (err.level === 'client-timeout') {
    return new SshError('Timeout', `SSH handshake with ${where} timed out`, { cause: err });
  }
  if (err.level === 'client-authentication') {
    return new SshError('SSHHandshakeFailed', `SSH authentication as ${to.username}@${where} failed`, {
      cause: err,
    });
  }
  return new SshError('SSHHandshakeFailed', `SSH handshake with ${where} failed: ${err.message}`, {
    cause: err,
  });
}
