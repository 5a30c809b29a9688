/**
 * test/support/ports — free TCP ports for tests that must name ports up front (the local
 * provider's portRange, listen flags). Blocks lie below the kernel's ephemeral range (32768+),
 * so outgoing connections of other tests never land in them, and start at a slot derived from
 * the worker's pid, so parallel test files rarely meet, without unseeded randomness.
 */
import { createServer } from 'node:net';

/** Whether `port` can be bound on 127.0.0.1 right now. */
export function canBind(port: number): Promise<boolean> {
  const srv = createServer();
  return new Promise((r) => {
    srv.once('error', () => r(false));
    srv.listen({ host: '127.0.0.1', port, exclusive: true }, () => srv.close(() => r(true)));
  });
}

/** A port the kernel just handed out (and we released). */
export function freePort(): Promise<number> {
  const srv = createServer();
  return new Promise((resolve, reject) => {
    srv.once('error', reject);
    srv.listen({ host: '127.0.0.1', port: 0, exclusive: true }, () => {
      const { port } = srv.address() as { port: number };
      srv.close(() => resolve(port));
    });
  });
}

const LOW = 21_000;
const HIGH = 32_000;
/** Blocks handed out by this process, so two calls never overlap. */
let nextSlot = (process.pid * 7919) % (HIGH - LOW);

/** `n` consecutive ports below the ephemeral range, free right now. */
export async function freePortRange(n: number): Promise<{ from: number; to: number }> {
  const span = HIGH - LOW - n;
  for (let attempt = 0; attempt < 200; attempt++) {
    const from = LOW + (nextSlot % span);
    nextSlot += n + 1;
    let ok = true;
    for (let p = from; p < from + n && ok; p++) ok = await canBind(p);
    if (ok) return { from, to: from + n - 1 };
  }
  throw new Error(`no ${n} consecutive free ports in ${LOW}-${HIGH}`);
}

/** The ports of a range, in order: `const [a, b] = consecutive(await freePortRange(2))`. */
export function consecutive(range: { from: number; to: number }): number[] {
  return Array.from({ length: range.to - range.from + 1 }, (_, i) => range.from + i);
}
