/**
 * test/support/random — seeded pseudo-randomness for tests: a failure reproduces with the seed
 * it prints, never "once in a while". TEST_SEED overrides the default seed.
 */

/** The seed tests use unless they pick their own; `TEST_SEED=n` reruns a reported failure. */
export const TEST_SEED = Number(process.env.TEST_SEED ?? 20260101);

/** mulberry32: a small, fast, well-mixed 32-bit generator; uniform in [0, 1). */
export function seededRandom(seed: number = TEST_SEED): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
