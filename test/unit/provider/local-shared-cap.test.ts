/**
 * The local proxies' shared connection cap: listeners of one process together hold at most its
 * number of client connections (their count follows the fleet, so a per-listener cap alone
 * could not keep their sum under the open-files limit); a connection over it is closed on
 * accept and counted as dropped, and a closed one frees its place for any listener.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { silentLogger } from '../../../src/log/index.ts';
import { ForwardProxy, SharedConnectionCap } from '../../../src/provider/local/forward-proxy.ts';
import { openIdle } from '../../support/listeners.ts';
import { until } from '../../support/wait.ts';

const closers: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of closers.splice(0).reverse()) await c();
});

describe('local proxies: one cap across listeners', () => {
  it('closes a connection over the shared cap, whichever listener it reaches', async () => {
    const cap = new SharedConnectionCap(2);
    let dropped = 0;
    const proxies = [
      new ForwardProxy({
        credentials: { username: 'u', password: 'p' },
        log: silentLogger(),
        sharedCap: cap,
        onDropped: () => dropped++,
      }),
      new ForwardProxy({
        credentials: { username: 'u', password: 'p' },
        log: silentLogger(),
        sharedCap: cap,
        onDropped: () => dropped++,
      }),
    ];
    for (const p of proxies) {
      await p.listen(0, '127.0.0.1');
      closers.push(() => p.close());
    }
    const [a, b] = proxies as [ForwardProxy, ForwardProxy];
    const first = await openIdle(a.port);
    const second = await openIdle(b.port);
    closers.push(
      () => void first.socket.destroy(),
      () => void second.socket.destroy(),
    );
    const third = await openIdle(a.port);
    expect(await third.closed).toBeLessThan(5_000);
    expect(dropped).toBe(1);
    first.socket.destroy();
    await until('the place to be freed', () => cap.open === 1);
    const fourth = await openIdle(b.port);
    closers.push(() => void fourth.socket.destroy());
    await until('the other listener to take it', () => cap.open === 2);
    expect(dropped).toBe(1);
    expect(fourth.socket.destroyed).toBe(false);
  });
});
