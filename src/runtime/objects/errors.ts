/**
 * runtime/objects/errors — the API errors the object engine raises with a Kubernetes Status's
 * `details`, apart from the rules so that the object types can raise them too.
 */
import { StoreError } from '../store.ts';

/** One field's problem, as a Kubernetes Status lists it in `details.causes`. */
export interface FieldCause {
  reason: 'FieldValueInvalid' | 'FieldValueRequired' | 'FieldValueForbidden' | 'FieldValueNotSupported';
  message: string;
  field: string;
}

/** A Kubernetes Status's `details`: which object, named by kind or by resource, and why. */
export interface ErrorDetails {
  name?: string;
  group?: string;
  kind?: string;
  causes?: FieldCause[];
}

/**
 * A StoreError that carries the `details` the API server reports with it: they differ between
 * errors of one reason (a stale update names the resource, a failed delete precondition the
 * kind; a failed JSON patch names nothing), so the engine, which knows which case it is, says.
 */
export class ObjectError extends StoreError {
  readonly details: ErrorDetails;
  constructor(
    reason: StoreError['reason'],
    code: number,
    message: string,
    details: ErrorDetails,
    opts?: { cause?: unknown },
  ) {
    super(reason, code, message, opts);
    this.details = details;
  }
}
