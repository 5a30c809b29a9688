/**
 * lease/errors — every error the lease store throws, in one place: what a client sent wrong
 * (LeaseInputError, a 400 naming the field), a full store (TooManyLeasesError, a 503), a
 * checkpoint document that cannot be read back (LeaseStateError) and the refusal to start from
 * a damaged one (LeaseCheckpointDamagedError).
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

/**
 * The lease checkpoint at `where` is damaged: starting without it would silently drop every
 * cooldown, and the next save would overwrite the evidence. Permanent — reading it again gives
 * the same — unlike a store that cannot be read right now.
 */
export class LeaseCheckpointDamagedError extends Error {
  readonly where: string;
  constructor(where: string, cause: LeaseStateError) {
    super(
      `lease checkpoint ${where} is damaged (${cause.message.replace(/^lease checkpoint: /, '')}); ` +
        'it is left as it is. Repair or remove it, or start with --discard-lease-state to start ' +
        'without its leases and cooldowns (the damaged copy is then kept aside)',
      { cause },
    );
    this.name = 'LeaseCheckpointDamagedError';
    this.where = where;
  }
}
