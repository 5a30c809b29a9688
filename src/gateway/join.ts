/**
 * gateway/join — two connections joined both ways until either ends: a CONNECT tunnel
 * (gateway/tunnel) and a connection that switched protocols inside an inspected one
 * (gateway/exchange) end, time out and give back their lease the same way.
 */
import type net from 'node:net';
import type { GatewayContext } from './context.ts';
import type { Acquired } from './upstreams.ts';

/**
 * Joins a client's connection and the far one, for a tunnel or a connection that switched
 * protocols: bytes flow both ways until either side ends (a half-close travels through), an
 * error or `--gateway-idle-timeout` of silence cuts both, and the lease `a` is held until both
 * have closed. `farToClient` starts the far side's bytes towards the client.
 */
export function joinBothWays(
  ctx: GatewayContext,
  a: Acquired,
  client: net.Socket,
  far: net.Socket,
  o: { kind: 'connect' | 'https'; farToClient: () => void; onClosed: () => void },
): void {
  const key = a.upstream.key;
  ctx.metrics.open.inc({ kind: o.kind });
  let closed = false;
  const close = () => {
    if (closed) return;
    closed = true;
    client.destroy();
    far.destroy();
  };
  ctx.hold(a, close);
  for (const s of [client, far]) s.setTimeout(ctx.limits.idleTimeoutMs, close);
  far.on('error', close);
  client.on('error', close);
  // Each direction ends the other side when it ends, so a half-close travels through.
  client.pipe(far);
  o.farToClient();
  let finished = 0;
  const onClose = () => {
    if (++finished === 1) {
      // One side is gone: unless both directions finished cleanly, cut the other one.
      const clean = client.readableEnded && far.readableEnded;
      if (!clean) close();
      return;
    }
    ctx.metrics.open.dec({ kind: o.kind });
    ctx.metrics.bytes.inc({ upstream: key, direction: 'sent' }, far.bytesWritten);
    ctx.metrics.bytes.inc({ upstream: key, direction: 'received' }, far.bytesRead);
    ctx.letGo(a);
    o.onClosed();
  };
  client.once('close', onClose);
  far.once('close', onClose);
}
