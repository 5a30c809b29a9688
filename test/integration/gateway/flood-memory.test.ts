/**
 * A flood of connections without credentials against a gateway in its own process
 * (test/support/gateway/flood-target): the gateway closes every one of them itself (refused on
 * accept over the unauthenticated cap, or past the unauthenticated deadline), and the process's
 * RSS settles back near where it was. Before the unauthenticated cap, 10,000 silent connections
 * were all held for the 120 s idle timeout and left RSS about 125 MB higher for good (glibc's
 * heap keeps what the per-connection native state took at its peak).
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import net from 'node:net';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { afterEach, describe, expect, it } from 'vitest';
import { NODE, REPO_ROOT } from '../../support/cli.ts';
import { until } from '../../support/wait.ts';

const TARGET = join(REPO_ROOT, 'test/support/gateway/flood-target.ts');
const FLOOD = 10_000;
/** Generous and one-sided: the machine is shared, and RSS moves by a few MB on its own. */
const SETTLED_GROWTH_MB = 40;

let child: ChildProcess | undefined;
afterEach(() => {
  child?.kill('SIGKILL');
  child = undefined;
});

function rssMb(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return Number(m?.[1]) / 1024;
}

async function startTarget(): Promise<{ pid: number; port: number }> {
  const proc = spawn(NODE, [TARGET], {
    stdio: ['ignore', 'pipe', 'inherit'],
    env: { PATH: process.env.PATH, GATEWAY_UNAUTHENTICATED_TIMEOUT_MS: '2000' },
  });
  child = proc;
  let port: number | undefined;
  createInterface({ input: proc.stdout as NodeJS.ReadableStream }).on('line', (l) => {
    port = (JSON.parse(l) as { port: number }).port;
  });
  await until('the flood target to listen', () => port, {
    timeoutMs: 15_000,
    failFast: () => (proc.exitCode !== null ? `exited with ${proc.exitCode}` : undefined),
  });
  return { pid: proc.pid as number, port: port as number };
}

/** RSS once two readings a second apart differ by less than 2 MB (start-up has finished). */
async function steadyRss(pid: number): Promise<number> {
  let last = rssMb(pid);
  return until(
    'RSS to stop moving',
    async () => {
      await new Promise((r) => setTimeout(r, 1000));
      const now = rssMb(pid);
      const steady = Math.abs(now - last) < 2;
      last = now;
      return steady && now;
    },
    { timeoutMs: 15_000, intervalMs: 0 },
  );
}

/**
 * `count` connections without credentials, a third each: silent, half a request head, a whole
 * CONNECT without Proxy-Authorization. Resolves once the gateway has closed every one.
 */
async function flood(port: number, count: number): Promise<void> {
  let closed = 0;
  for (let i = 0; i < count; i++) {
    const s = net.connect(port, '127.0.0.1');
    s.on('error', () => undefined);
    s.on('close', () => closed++);
    // Reading is what notices the gateway's FIN (a paused socket would wait for ever).
    s.resume();
    if (i % 3 === 1) s.write('CONNECT example.com:443 HTTP/1.1\r\nHost: exa');
    if (i % 3 === 2) s.write('CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n');
    // Paced (about 10,000 a second): faster, the kernel's accept queue overflows, and a silent
    // client whose handshake the kernel then dropped would wait for nothing, never accepted.
    if (i % 200 === 199) await new Promise((r) => setTimeout(r, 20));
  }
  await until(`the gateway to close all ${count} connections`, () => closed === count || undefined, {
    timeoutMs: 20_000,
    intervalMs: 50,
  }).catch((err: Error) => {
    throw new Error(`${err.message} (${closed} closed)`);
  });
}

describe('gateway under a flood of connections without credentials', () => {
  it('closes them all itself and gives the memory back', async () => {
    const { pid, port } = await startTarget();
    const baseline = await steadyRss(pid);
    await flood(port, FLOOD);
    const peak = rssMb(pid);
    let settled = peak;
    await until(
      `RSS to settle within ${SETTLED_GROWTH_MB} MB of ${baseline.toFixed(0)} MB`,
      () => {
        settled = rssMb(pid);
        return settled - baseline < SETTLED_GROWTH_MB;
      },
      { timeoutMs: 10_000, intervalMs: 250 },
    ).catch((err: Error) => {
      throw new Error(`${err.message}: peak ${peak.toFixed(0)} MB, last ${settled.toFixed(0)} MB`);
    });
    expect(settled - baseline).toBeLessThan(SETTLED_GROWTH_MB);
  });
});
