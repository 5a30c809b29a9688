/**
 * provider/kvm/errors — how the kvm provider classifies a failure: libvirt error codes and SSH
 * failure reasons become the provider error classes (NotFound, Permanent, Transient), and the
 * libvirt codes a step may expect ("already exists", "already gone") are ignored where it says so.
 */
import { type ErrorClass, ProviderError, wrap } from '../errors.ts';
import { ErrorCode, isLibvirtError } from './libvirt-protocol.ts';
import { SshError } from './ssh-error.ts';

const PERMANENT_LIBVIRT_CODES: ReadonlySet<number> = new Set([
  ErrorCode.INVALID_ARG,
  ErrorCode.XML_ERROR,
  ErrorCode.CONFIG_UNSUPPORTED,
  ErrorCode.ARGUMENT_UNSUPPORTED,
  ErrorCode.OPERATION_UNSUPPORTED,
  ErrorCode.NO_SUPPORT,
]);

function errorClassOf(err: unknown): ErrorClass {
  if (err instanceof ProviderError) return err.errorClass;
  if (err instanceof SshError) return err.reason === 'SSHMaterialInvalid' ? 'Permanent' : 'Transient';
  if (isLibvirtError(err)) {
    if (err.code === ErrorCode.NO_DOMAIN) return 'NotFound';
    if (PERMANENT_LIBVIRT_CODES.has(err.code)) return 'Permanent';
  }
  return 'Transient';
}

/** `p`'s value, or undefined when it fails with one of the libvirt error `codes`. */
export async function ignoreCode<T>(p: Promise<T>, ...codes: number[]): Promise<T | undefined> {
  try {
    return await p;
  } catch (err) {
    if (isLibvirtError(err) && codes.includes(err.code)) return undefined;
    throw err;
  }
}

/**
 * `err` as a ProviderError of provider `provider`, classified by origin; after an abort every
 * failure is Transient (the caller gave up, nothing is known about the instance).
 */
export function toProviderError(
  provider: string,
  err: unknown,
  where: { op: string; provider: string; providerID?: string },
  signal: AbortSignal,
): ProviderError {
  if (err instanceof ProviderError && err.provider === provider) return err;
  const cls = signal.aborted ? 'Transient' : errorClassOf(err);
  return wrap(cls, err, where);
}
