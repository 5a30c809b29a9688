/**
 * lease/errors — every error the lease store throws, in one place: what a client sent wrong
 * (LeaseInputError, a 400 naming the field), a full store (TooManyLeasesError, a 503) and a
 * checkpoint that cannot be read back (LeaseStateError).
 */

/** Input a lease client sent that the store refuses; `field` names what to fix. */
export class LeaseInputError extends Error {
  readonly field: string;
  constructor(field: string, message: string) {
    super(message);
    this.name = 'LeaseInputError';
    this.field = field;
  }
}

/** A grant refused because `maxActiveLeases` leases are live (503 too_many_leases). */
export class TooManyLeasesError extends Error {
  readonly limit: number;
  constructor(limit: number) {
    super(`${limit} leases are active, the most this operator holds (--max-active-leases)`);
    this.name = 'TooManyLeasesError';
    this.limit = limit;
  }
}

/** A checkpoint document refused whole (lease/durable), naming the first bad field. */
export class LeaseStateError extends Error {
  constructor(message: string) {
    super(`lease checkpoint: ${message}`);
    this.name = 'LeaseStateError';
  }
}
