/**
 * The gateway's one HTTP/1.1 client (gateway/http1, reading with gateway/http1-wire) against a
 * scripted far side on loopback: every framing an origin or upstream may use (length, chunked, until close, none), interim
 * answers, kept-alive connections and the race of reusing one the far side already closed,
 * broken answers failing instead of reaching a client, and a body that flows only when asked.
 */
import net from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { type Answer, ConnectionPool, type OutgoingRequest, request } from '../../../src/gateway/http1.ts';
import { ChunkedReader, parseAnswerHead } from '../../../src/gateway/http1-wire.ts';
import { until } from '../../support/wait.ts';

const head = (text: string) => {
  const buf = Buffer.from(`${text}\r\n\r\n`, 'latin1');
  return { buf, end: buf.length - 4 };
};
const parse = (text: string, method = 'GET') => {
  const h = head(text);
  return parseAnswerHead(h.buf, h.end, method);
};

describe('answer heads', () => {
  it('frames by Content-Length, chunked, nothing, or the close', () => {
    expect(parse('HTTP/1.1 200 OK\r\nContent-Length: 12')).toMatchObject({
      statusCode: 200,
      statusMessage: 'OK',
      keepAlive: true,
      framing: { kind: 'length', bytes: 12 },
    });
    expect(parse('HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked')).toMatchObject({
      framing: { kind: 'chunked' },
      keepAlive: true,
    });
    expect(parse('HTTP/1.1 200 OK')).toMatchObject({ framing: { kind: 'close' }, keepAlive: false });
    expect(parse('HTTP/1.1 200 OK\r\nContent-Length: 5', 'HEAD')).toMatchObject({
      framing: { kind: 'none' },
    });
    for (const status of [204, 304]) {
      expect(parse(`HTTP/1.1 ${status} X\r\nContent-Length: 5`)).toMatchObject({ framing: { kind: 'none' } });
    }
  });

  it('keeps a connection only when both sides may', () => {
    expect(parse('HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0')).toMatchObject({
      keepAlive: false,
    });
    expect(parse('HTTP/1.0 200 OK\r\nContent-Length: 0')).toMatchObject({ keepAlive: false });
    expect(parse('HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0')).toMatchObject({
      keepAlive: true,
    });
    // A length beside a transfer coding: read as chunked, the connection not kept.
    expect(parse('HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked')).toMatchObject({
      framing: { kind: 'chunked' },
      keepAlive: false,
    });
  });

  it('gives the headers as Node would: repeats joined, set-cookie a list, single ones first-wins', () => {
    const h = parse(
      'HTTP/1.1 200 OK\r\nSet-Cookie: a=1\r\nVary: a\r\nset-cookie: b=2\r\nVary: b\r\nContent-Type: x/y\r\nContent-Type: z/w\r\nContent-Length: 0',
    );
    if (typeof h === 'string') throw new Error(h);
    expect(h.headers['set-cookie']).toEqual(['a=1', 'b=2']);
    expect(h.headers.vary).toBe('a, b');
    expect(h.headers['content-type']).toBe('x/y');
    expect(h.rawHeaders.slice(0, 4)).toEqual(['Set-Cookie', 'a=1', 'Vary', 'a']);
  });

  it('refuses what must not reach a client', () => {
    expect(parse('HTTP/2 200 OK')).toMatch(/status line/);
    expect(parse('HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4')).toMatch(/Content-Length/);
    expect(parse('HTTP/1.1 200 OK\r\nContent-Length: -1')).toMatch(/Content-Length/);
    expect(parse('HTTP/1.1 200 OK\r\nX-A: 1\r\n folded')).toMatch(/folded/);
    expect(parse('HTTP/1.1 200 OK\r\nBad Name: 1')).toMatch(/invalid header line/);
    expect(parse('HTTP/1.1 200 OK\r\nX-A: a\u0000b')).toMatch(/invalid character in header X-A/);
    expect(parse('HTTP/1.1 200 O\u0001K')).toMatch(/reason phrase/);
  });
});

describe('chunked bodies', () => {
  const wire = Buffer.from('5;ext=1\r\nhello\r\n1\r\n \r\n5\r\nworld\r\n0\r\nTrailer: x\r\n\r\n', 'latin1');

  it('gives the same body however the bytes are split, and stops after the trailers', () => {
    for (let split = 1; split < wire.length; split++) {
      const reader = new ChunkedReader();
      const body: Buffer[] = [];
      for (const part of [wire.subarray(0, split), wire.subarray(split)]) {
        const used = reader.feed(part, (s) => body.push(Buffer.from(s)) > 0);
        expect(used).toBe(part.length);
      }
      expect(Buffer.concat(body).toString()).toBe('hello world');
      expect(reader.done).toBe(true);
    }
  });

  it('names a broken framing', () => {
    expect(new ChunkedReader().feed(Buffer.from('zz\r\n'), () => true)).toMatch(/chunk size/);
    expect(new ChunkedReader().feed(Buffer.from('2\r\nabc\r\n'), () => true)).toMatch(/longer than its size/);
  });
});

/** A far side that answers each request head it reads with what `script` writes. */
async function farSide(script: (socket: net.Socket, requestHead: string, n: number) => void): Promise<{
  port: number;
  connections: () => number;
  heads: string[];
  bodies: Buffer[];
  close: () => void;
}> {
  let connections = 0;
  const heads: string[] = [];
  const bodies: Buffer[] = [];
  const sockets = new Set<net.Socket>();
  const server = net.createServer((s) => {
    connections++;
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
    let buf = Buffer.alloc(0);
    s.on('data', (c) => {
      buf = Buffer.concat([buf, c]);
      for (;;) {
        const end = buf.indexOf('\r\n\r\n');
        if (end < 0) return;
        const text = buf.toString('latin1', 0, end);
        const length = Number(/content-length: (\d+)/i.exec(text)?.[1] ?? 0);
        const chunked = /transfer-encoding: chunked/i.test(text);
        const bodyEnd = chunked ? buf.indexOf('0\r\n\r\n', end + 4) + 5 : end + 4 + length;
        if ((chunked && bodyEnd < 5) || buf.length < bodyEnd) return;
        heads.push(text);
        bodies.push(buf.subarray(end + 4, bodyEnd));
        buf = buf.subarray(bodyEnd);
        script(s, text, heads.length);
      }
    });
    s.on('error', () => undefined);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  return {
    port: (server.address() as net.AddressInfo).port,
    connections: () => connections,
    heads,
    bodies,
    close: () => {
      for (const s of sockets) s.destroy();
      server.close();
    },
  };
}

let cleanup: (() => void)[] = [];
afterEach(() => {
  for (const c of cleanup) c();
  cleanup = [];
});

async function world(script: Parameters<typeof farSide>[0], idleMs = 5000) {
  const far = await farSide(script);
  const pool = new ConnectionPool({ maxFree: 4, idleMs: 5000 });
  cleanup.push(far.close, () => pool.close());
  const send = (method: string, headers: [string, string][] = [], body?: string): OutgoingRequest => {
    const r = request({
      method,
      target: '/x',
      headers: [['Host', 'example.test'], ...headers],
      pool,
      key: 'far',
      idleMs,
      connect: () =>
        new Promise((resolve, reject) => {
          const s = net.connect(far.port, '127.0.0.1', () => resolve(s));
          s.once('error', reject);
        }),
    });
    if (body !== undefined) r.write(Buffer.from(body));
    r.end();
    return r;
  };
  return { far, pool, send };
}

type Outcome = { status: number; body: string; answer: Answer } | { error: string };

function outcome(r: OutgoingRequest): Promise<Outcome> {
  return new Promise((resolve) => {
    r.once('error', (err: NodeJS.ErrnoException) => resolve({ error: `${err.code}: ${err.message}` }));
    r.once('response', (answer: Answer) => {
      const parts: Buffer[] = [];
      answer.on('data', (c: Buffer) => parts.push(c));
      answer.once('end', () =>
        resolve({ status: answer.statusCode, body: Buffer.concat(parts).toString(), answer }),
      );
      answer.once('error', (err: NodeJS.ErrnoException) => resolve({ error: `${err.code}: ${err.message}` }));
      answer.resume();
    });
  });
}

describe('the client', () => {
  it('reuses one connection for answers framed by length and by chunks', async () => {
    const { far, send } = await world((s, _h, n) =>
      s.write(
        n % 2 === 1
          ? 'HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello'
          : 'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n',
      ),
    );
    for (const body of ['hello', 'abc', 'hello', 'abc']) {
      expect(await outcome(send('GET'))).toMatchObject({ status: 200, body });
    }
    expect(far.connections()).toBe(1);
    expect(far.heads[0]).toBe('GET /x HTTP/1.1\r\nHost: example.test');
  });

  it('reads an answer without length to the close, and does not keep that connection', async () => {
    const { far, send } = await world((s) => s.end('HTTP/1.1 200 OK\r\n\r\nuntil the end'));
    expect(await outcome(send('GET'))).toMatchObject({ status: 200, body: 'until the end' });
    expect(await outcome(send('GET'))).toMatchObject({ status: 200, body: 'until the end' });
    expect(far.connections()).toBe(2);
  });

  it('skips interim answers and gives the final one', async () => {
    const { send } = await world((s) =>
      s.write(
        'HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok',
      ),
    );
    expect(await outcome(send('POST', [['Content-Length', '3']], 'abc'))).toMatchObject({
      status: 201,
      body: 'ok',
    });
  });

  it('sends a body without a length chunked, and one with a length as it is', async () => {
    const { far, send } = await world((s) => s.write('HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n'));
    await outcome(send('POST', [], 'streamed'));
    await outcome(send('PUT', [['Content-Length', '5']], 'sized'));
    expect(far.heads[0]).toMatch(/\r\nTransfer-Encoding: chunked$/);
    expect(far.bodies[0]?.toString()).toBe('8\r\nstreamed\r\n0\r\n\r\n');
    expect(far.heads[1]).not.toMatch(/Transfer-Encoding/);
    expect(far.bodies[1]?.toString()).toBe('sized');
  });

  it('sends a request again on a new connection when a kept one was closed under it', async () => {
    // The far side answers, keeps the connection open, and closes it as the next request comes.
    const { far, send } = await world((s, _h, n) => {
      if (n === 2) s.destroy();
      else s.write('HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok');
    });
    expect(await outcome(send('GET'))).toMatchObject({ status: 200 });
    expect(await outcome(send('GET'))).toMatchObject({ status: 200, body: 'ok' });
    expect(far.connections()).toBe(2);
    expect(far.heads).toHaveLength(3);
  });

  it('does not send a body twice: a kept connection closed under an upload fails the request', async () => {
    const { send } = await world((s, _h, n) => {
      if (n === 2) s.destroy();
      else s.write('HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok');
    });
    await outcome(send('GET'));
    expect(await outcome(send('POST', [['Content-Length', '4']], 'data'))).toMatchObject({
      error: expect.stringMatching(/^ECONNRESET/),
    });
  });

  it('fails an answer cut short, a broken head and an upgrade', async () => {
    const cut = await world((s) => s.end('HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort'));
    expect(await outcome(cut.send('GET'))).toMatchObject({ error: expect.stringMatching(/^ECONNRESET/) });
    const broken = await world((s) => s.write('HTTP/1.1 200 OK\r\nX: a\u0000b\r\n\r\n'));
    expect(await outcome(broken.send('GET'))).toMatchObject({
      error: expect.stringMatching(/^EPROTO: invalid character in header X/),
    });
    const upgrade = await world((s) => s.write('HTTP/1.1 101 Switching Protocols\r\nUpgrade: ws\r\n\r\n'));
    expect(await outcome(upgrade.send('GET'))).toMatchObject({
      error: expect.stringMatching(/^EPROTO: a protocol switch the request did not ask for/),
    });
  });

  it('hands a request that asked to upgrade its connection with a 101, never to the pool', async () => {
    const { far, pool, send } = await world((s) => {
      s.write('HTTP/1.1 101 Switching Protocols\r\nUpgrade: ws\r\nConnection: Upgrade\r\n\r\nhello');
      // From here on the connection speaks the new protocol: an echo.
      s.removeAllListeners('data');
      s.on('data', (c: Buffer) => s.write(`echo ${c.toString()}`));
    });
    const r = send('GET', [
      ['Connection', 'Upgrade'],
      ['Upgrade', 'ws'],
    ]);
    const answer = await new Promise<Answer>((resolve) => r.once('response', resolve));
    expect(answer.statusCode).toBe(101);
    expect(answer.headers.upgrade).toBe('ws');
    const up = answer.upgraded;
    if (!up) throw new Error('no upgraded connection');
    let got = up.rest.toString();
    up.socket.on('data', (c: Buffer) => {
      got += c.toString();
    });
    up.socket.resume();
    await until('what the far side sent after the head', () => got.includes('hello'));
    up.socket.write('ping');
    await until('the echo in the new protocol', () => got.endsWith('echo ping'));
    expect(got).toBe('helloecho ping');
    expect(far.heads[0]).toMatch(/\r\nUpgrade: ws/);
    // The connection is the answer's: destroying the answer closes it, and nothing was pooled.
    answer.destroy();
    await until('the upgraded connection closed', () => up.socket.destroyed);
    expect(pool.take('far')).toBeUndefined();
  });

  it('keeps a break that came while nobody listened for when the answer is resumed', async () => {
    // The far side sends the head and goes quiet: the idle timeout breaks the answer while it
    // is still paused, before anyone listens for an error.
    const { send } = await world((s) => s.write('HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n'), 50);
    const r = send('GET');
    const answer = await new Promise<Answer>((resolve) => r.once('response', resolve));
    await until('the idle timeout', () => (answer as unknown as { eof?: Error }).eof);
    const got: string[] = [];
    answer.on('data', (c: Buffer) => got.push(c.toString()));
    const failed = new Promise<NodeJS.ErrnoException>((resolve) => answer.once('error', resolve));
    answer.resume();
    expect((await failed).code).toBe('ETIMEDOUT');
    expect(got).toEqual([]);
  });

  it('lets nothing flow until resumed, and hands on what it read in order', async () => {
    const body = 'x'.repeat(200_000);
    const { send } = await world((s) => {
      s.write(`HTTP/1.1 200 OK\r\nContent-Length: ${body.length}\r\n\r\n`);
      s.write(body);
    });
    const r = send('GET');
    const answer = await new Promise<Answer>((resolve) => r.once('response', resolve));
    let seen = 0;
    answer.on('data', (c: Buffer) => {
      seen += c.length;
    });
    // The whole body has arrived at this end, and still nothing was handed on.
    await until('body buffered', () => (answer as unknown as { queue: Buffer[] }).queue.length > 0);
    expect(seen).toBe(0);
    const ended = new Promise((resolve) => answer.once('end', resolve));
    answer.resume();
    await ended;
    expect(seen).toBe(body.length);
  });
});
