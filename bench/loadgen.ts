/**
 * bench/loadgen — the lease bench's load generator, run as its own process so the server's CPU
 * figures are the server's alone. Each of `clients` loops repeats one lease pair against
 * `url` — `POST /v1/leases` with a JSON body, then `DELETE /v1/leases/<id>` — for a warm-up and
 * then a measured window, and prints one JSON line: pairs, seconds, p50/p99 latency of single
 * requests (ms), errors. The bare baseline and the discovery API get exactly the same requests.
 * With `get`, each loop repeats one `GET <get>` instead (bench/scale: a `GET /v1/proxies` page),
 * counted as one pair each.
 */
import { Pool } from 'undici';

export interface LoadgenArgs {
  url: string;
  /** The JSON body of every POST /v1/leases. */
  body: string;
  token: string;
  clients: number;
  durationMs: number;
  warmupMs: number;
  /** A path to GET instead of the lease pair. */
  get?: string;
}

export interface LoadgenResult {
  pairs: number;
  seconds: number;
  p50Millis: number;
  p99Millis: number;
  errors: number;
}

function quantile(sorted: Float64Array, q: number): number {
  if (sorted.length === 0) return 0;
  return sorted[Math.min(sorted.length - 1, Math.floor(sorted.length * q))]!;
}

async function run(args: LoadgenArgs): Promise<LoadgenResult> {
  const pool = new Pool(args.url, { connections: args.clients, pipelining: 1 });
  const auth = `Bearer ${args.token}`;
  const postHeaders = { authorization: auth, 'content-type': 'application/json' };
  let errors = 0;
  const pair = async (latencies: number[] | undefined): Promise<void> => {
    let t0 = performance.now();
    if (args.get !== undefined) {
      const res = await pool.request({ method: 'GET', path: args.get, headers: { authorization: auth } });
      await res.body.dump();
      latencies?.push(performance.now() - t0);
      if (res.statusCode !== 200) errors++;
      return;
    }
    const res = await pool.request({
      method: 'POST',
      path: '/v1/leases',
      headers: postHeaders,
      body: args.body,
    });
    const grant = (await res.body.json()) as { id?: string };
    latencies?.push(performance.now() - t0);
    if (res.statusCode !== 201 || !grant.id) {
      errors++;
      return;
    }
    t0 = performance.now();
    const del = await pool.request({
      method: 'DELETE',
      path: `/v1/leases/${grant.id}`,
      headers: { authorization: auth },
    });
    await del.body.dump();
    latencies?.push(performance.now() - t0);
    if (del.statusCode !== 204) errors++;
  };

  const loops = (until: number, latencies: number[] | undefined, done: { n: number }) =>
    Promise.all(
      Array.from({ length: args.clients }, async () => {
        while (performance.now() < until) {
          await pair(latencies);
          done.n++;
        }
      }),
    );

  await loops(performance.now() + args.warmupMs, undefined, { n: 0 });
  errors = 0;
  const latencies: number[] = [];
  const done = { n: 0 };
  const start = performance.now();
  await loops(start + args.durationMs, latencies, done);
  const seconds = (performance.now() - start) / 1000;
  await pool.close();
  const sorted = Float64Array.from(latencies).sort();
  return {
    pairs: done.n,
    seconds,
    p50Millis: quantile(sorted, 0.5),
    p99Millis: quantile(sorted, 0.99),
    errors,
  };
}

const args = JSON.parse(process.argv[2] ?? '{}') as LoadgenArgs;
process.stdout.write(`${JSON.stringify(await run(args))}\n`);
