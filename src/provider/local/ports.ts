/**
 * provider/local/ports — which port of the range a local proxy listens on: the order ports are
 * tried in, so a re-created instance usually gets its old port back (docs/providers/local.md,
 * "Instances live inside the operator process"), and the bind test the health check uses.
 */
import { createHash } from 'node:crypto';
import net from 'node:net';

/** The first port tried for an instance name: a stable hash of the name into the range. */
export function preferredPort(name: string, from: number, to: number): number {
  const h = createHash('sha256').update(name).digest().readUInt32BE(0);
  return from + (h % (to - from + 1));
}

/**
 * The ports to try, in order: `preferred` ones inside the range (the port the name had in this
 * process, the requested port), then the whole range from the name's hash slot; ports in
 * `taken` are left out. Instance names are deterministic, so after a restart a re-created
 * instance usually lands on the port it had before.
 */
export function* portCandidates(
  name: string,
  preferred: ReadonlyArray<number | undefined>,
  range: { from: number; to: number },
  taken: ReadonlySet<number>,
): Generator<number> {
  const { from, to } = range;
  const tried = new Set<number>();
  for (const p of preferred) {
    if (p === undefined || p < from || p > to || taken.has(p) || tried.has(p)) continue;
    tried.add(p);
    yield p;
  }
  const size = to - from + 1;
  const first = preferredPort(name, from, to);
  for (let i = 0; i < size; i++) {
    const p = from + ((first - from + i) % size);
    if (taken.has(p) || tried.has(p)) continue;
    tried.add(p);
    yield p;
  }
}

/** Binds and releases a port; the error code when that fails. */
export function tryBind(host: string, port: number): Promise<string | undefined> {
  return new Promise((resolve) => {
    const srv = net.createServer();
    srv.once('error', (err: NodeJS.ErrnoException) => resolve(err.code ?? 'EUNKNOWN'));
    srv.listen({ host, port, exclusive: true }, () => srv.close(() => resolve(undefined)));
  });
}
