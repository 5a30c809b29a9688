/**
 * lease/changes — counts what changes in the lease store, two ways: decisions a checkpoint must
 * carry (a checkpointer skips rounds where there were none), and any change at all (a refusal's
 * retryAt, kept per view, stays valid until the next one).
 */
export class ChangeCounter {
  private decisionCount = 0;
  private revisionCount = 0;

  /** Grows with every decision a checkpoint carries; equal values mean nothing to save. */
  get decisions(): number {
    return this.decisionCount;
  }

  /** Grows with every change, decisions included; equal values mean the store is as it was. */
  get revision(): number {
    return this.revisionCount;
  }

  decided(): void {
    this.decisionCount++;
    this.revisionCount++;
  }

  touched(): void {
    this.revisionCount++;
  }
}
