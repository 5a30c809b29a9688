/**
 * test/support/ports — free TCP ports for tests that must name ports up front (the local
 * provider's portRange, listen flags). The kernel picks the start (listen on port 0), so
 * parallel test files never pick the same block and no test depends on unseeded randomness.
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

/** `n` consecutive ports free right now, starting at a kernel-chosen port. */
export async function freePortRange(n: number): Promise<{ from: number; to: number }> {
  for (let attempt = 0; attempt < 50; attempt++) {
    const from = await freePort();
    if (from + n - 1 > 65535) continue;
    let ok = true;
    for (let p = from + 1; p < from + n && ok; p++) ok = await canBind(p);
    if (ok) return { from, to: from + n - 1 };
  }
  throw new Error(`no ${n} consecutive free ports`);
}
