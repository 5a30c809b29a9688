/**
 * log/errors — the one way an unknown thrown value becomes text.
 */

/** The message of an Error, or the value as a string. */
export function errorMessage(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}
