/**
 * XDR byte vectors, packet framing, and the RPC client's call matching, cancellation, keepalive,
 * close and stream behaviour against a scripted in-process peer; known_hosts parsing.
 */
import { createHmac, generateKeyPairSync, randomBytes } from 'node:crypto';
import { type Duplex, duplexPair } from 'node:stream';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import {
  encodePacket,
  type Header,
  KEEPALIVE_PROC_PING,
  KEEPALIVE_PROC_PONG,
  KEEPALIVE_PROGRAM,
  LibvirtError,
  MessageStatus,
  MessageType,
  type Packet,
  PacketDecoder,
  REMOTE_PROGRAM,
  RpcClient,
  RpcConnectionError,
  RpcProtocolError,
  STREAM_CHUNK_SIZE,
} from '../../../src/provider/kvm/rpc.ts';
import { hashKnownHostName, parseKnownHosts, SshError } from '../../../src/provider/kvm/ssh.ts';
import { XdrError, XdrReader, XdrWriter } from '../../../src/provider/kvm/xdr.ts';
import { FakeClock } from '../../support/clock.ts';
import { TEST_SEED } from '../../support/random.ts';

const hex = (b: Buffer) => b.toString('hex');

describe('XDR', () => {
  it('encodes primitives as RFC 4506 byte vectors', () => {
    expect(hex(new XdrWriter().int(-1).bytes())).toBe('ffffffff');
    expect(hex(new XdrWriter().int(258).bytes())).toBe('00000102');
    expect(hex(new XdrWriter().uint(0xfffffffe).bytes())).toBe('fffffffe');
    expect(hex(new XdrWriter().hyper(-2n).bytes())).toBe('fffffffffffffffe');
    expect(hex(new XdrWriter().uhyper(2n ** 64n - 1n).bytes())).toBe('ffffffffffffffff');
    expect(hex(new XdrWriter().uhyper(9_000_000).bytes())).toBe('0000000000895440');
    expect(hex(new XdrWriter().bool(true).bool(false).bytes())).toBe('0000000100000000');
    expect(hex(new XdrWriter().string('abc').bytes())).toBe('0000000361626300');
    expect(hex(new XdrWriter().string('abcd').bytes())).toBe('0000000461626364');
    expect(hex(new XdrWriter().string('').bytes())).toBe('00000000');
    expect(hex(new XdrWriter().string('é').bytes())).toBe('00000002c3a90000'); // length in bytes
    expect(hex(new XdrWriter().opaque(Buffer.from([1, 2, 3, 4, 5])).bytes())).toBe(
      '000000050102030405000000',
    );
    expect(hex(new XdrWriter().fixedOpaque(Buffer.from([9, 8])).bytes())).toBe('09080000');
    expect(hex(new XdrWriter().optional(null, (w, s: string) => w.string(s)).bytes())).toBe('00000000');
    expect(hex(new XdrWriter().optional('x', (w, s) => w.string(s)).bytes())).toBe(
      '000000010000000178000000',
    );
    expect(hex(new XdrWriter().array([1, 2], (w, n) => w.int(n)).bytes())).toBe('000000020000000100000002');
  });

  it('decodes what it encodes', () => {
    fc.assert(
      fc.property(
        fc.integer({ min: -0x8000_0000, max: 0x7fff_ffff }),
        fc.bigInt({ min: 0n, max: 2n ** 64n - 1n }),
        fc.string(),
        fc.uint8Array({ maxLength: 40 }),
        fc.option(fc.string(), { nil: null }),
        fc.array(fc.integer({ min: 0, max: 0xffff_ffff }), { maxLength: 10 }),
        (i, uh, s, bytes, opt, arr) => {
          const w = new XdrWriter(4)
            .int(i)
            .uhyper(uh)
            .string(s)
            .opaque(bytes)
            .optional(opt, (x, v) => x.string(v))
            .array(arr, (x, v) => x.uint(v));
          expect(w.length % 4).toBe(0);
          const r = new XdrReader(w.bytes());
          expect(r.int()).toBe(i);
          expect(r.uhyper()).toBe(uh);
          expect(r.string()).toBe(s);
          expect([...r.opaque()]).toEqual([...bytes]);
          expect(r.optional((x) => x.string())).toBe(opt);
          expect(r.array((x) => x.uint())).toEqual(arr);
          r.end();
        },
      ),
      { seed: TEST_SEED },
    );
  });

  it('rejects out-of-range values, truncated input and absurd lengths', () => {
    expect(() => new XdrWriter().int(2 ** 31)).toThrow(XdrError);
    expect(() => new XdrWriter().uint(-1)).toThrow('unsigned int out of range');
    expect(() => new XdrWriter().int(1.5)).toThrow(XdrError);
    expect(() => new XdrWriter().uhyper(-1n)).toThrow(XdrError);
    expect(() => new XdrWriter().string('abcdef', 3)).toThrow('longer than 3');
    expect(() => new XdrWriter().fixedOpaque(Buffer.alloc(3), 16)).toThrow('needs 16 bytes');
    expect(() => new XdrReader(Buffer.from('000000', 'hex')).int()).toThrow('truncated');
    expect(() => new XdrReader(Buffer.from('0000000561', 'hex')).string()).toThrow('truncated');
    expect(() => new XdrReader(Buffer.from('00000002', 'hex')).bool()).toThrow('bool must be 0 or 1');
    expect(() => new XdrReader(Buffer.from('7fffffff', 'hex')).array((r) => r.int())).toThrow(XdrError);
    expect(() => new XdrReader(Buffer.from('00000010', 'hex')).string(8)).toThrow('exceeds limit 8');
    const r = new XdrReader(Buffer.from('0000000100000002', 'hex'));
    r.int();
    expect(() => r.end()).toThrow('4 unexpected trailing bytes');
  });
});

describe('packet framing', () => {
  it('writes the 28-byte header libvirt expects', () => {
    const p = encodePacket(
      {
        prog: REMOTE_PROGRAM,
        vers: 1,
        proc: 66,
        type: MessageType.Call,
        serial: 1,
        status: MessageStatus.Ok,
      },
      Buffer.from('abcd'),
    );
    expect(hex(p)).toBe(
      `00000020200080860000000100000042000000000000000100000000${hex(Buffer.from('abcd'))}`,
    );
  });

  it('reassembles packets split at any byte and packed together', () => {
    const a = encodePacket({ prog: 1, vers: 1, proc: 7, type: 1, serial: 3, status: 0 }, randomBytes(10));
    const b = encodePacket({ prog: 1, vers: 1, proc: 8, type: 1, serial: 4, status: 1 });
    const all = Buffer.concat([a, b]);
    for (let cut = 1; cut < all.length; cut++) {
      const d = new PacketDecoder();
      const got = [...d.push(all.subarray(0, cut)), ...d.push(all.subarray(cut))];
      expect(got.map((p) => p.header.serial)).toEqual([3, 4]);
      expect(got[0]!.body.equals(a.subarray(28))).toBe(true);
      expect(got[1]!.header.status).toBe(1);
    }
  });

  it('refuses impossible lengths', () => {
    expect(() => new PacketDecoder().push(Buffer.from('00000010', 'hex'))).toThrow(RpcProtocolError);
    expect(() => new PacketDecoder().push(Buffer.from('7fffffff', 'hex'))).toThrow('invalid packet length');
  });

  it('round-trips a libvirt error body', () => {
    const e = new LibvirtError({
      code: 42,
      domain: 10,
      message: "no domain 'x'",
      level: 2,
      str1: 'x',
      int1: 7,
    });
    const d = LibvirtError.decode(e.encode());
    expect(d).toMatchObject({
      code: 42,
      domain: 10,
      message: "no domain 'x'",
      level: 2,
      str1: 'x',
      str2: null,
      int1: 7,
    });
  });
});

/** A scripted libvirtd: sees every packet the client sends and answers as the test says. */
class FakePeer {
  readonly side: Duplex;
  readonly client: Duplex;
  readonly received: Packet[] = [];
  private readonly decoder = new PacketDecoder();
  private waiters: Array<() => void> = [];
  onPacket: (p: Packet) => void = () => {};

  constructor() {
    const [a, b] = duplexPair();
    this.client = a;
    this.side = b;
    b.on('data', (chunk: Buffer) => {
      for (const p of this.decoder.push(chunk)) {
        this.received.push(p);
        this.onPacket(p);
        for (const w of this.waiters.splice(0)) w();
      }
    });
  }

  send(h: Partial<Header> & { serial: number; proc: number }, body?: Buffer): void {
    this.side.write(
      encodePacket(
        { prog: REMOTE_PROGRAM, vers: 1, type: MessageType.Reply, status: MessageStatus.Ok, ...h },
        body,
      ),
    );
  }

  async waitFor(pred: (ps: Packet[]) => boolean): Promise<void> {
    while (!pred(this.received)) await new Promise<void>((r) => this.waiters.push(r));
  }
}

const flush = () => new Promise((r) => setImmediate(r));

describe('RpcClient', () => {
  it('matches concurrent calls to replies by serial, whatever the reply order', async () => {
    const peer = new FakePeer();
    const rpc = new RpcClient(peer.client, { keepalive: false });
    const p1 = rpc.call(59);
    const p2 = rpc.call(4);
    const p3 = rpc.call(157);
    await peer.waitFor((ps) => ps.length === 3);
    const serials = peer.received.map((p) => p.header.serial);
    expect(new Set(serials).size).toBe(3);
    peer.send({ serial: serials[2]!, proc: 157 }, Buffer.from('03'));
    peer.send({ serial: serials[0]!, proc: 59 }, Buffer.from('01'));
    peer.send({ serial: serials[1]!, proc: 4 }, Buffer.from('02'));
    expect((await p1).toString()).toBe('01');
    expect((await p2).toString()).toBe('02');
    expect((await p3).toString()).toBe('03');
    rpc.close();
  });

  it('rejects an error reply with a LibvirtError and stays usable', async () => {
    const peer = new FakePeer();
    peer.onPacket = (p) => {
      if (p.header.proc === 23) {
        const err = new LibvirtError({ code: 42, domain: 10, level: 2, message: "Domain not found: 'nope'" });
        peer.send({ serial: p.header.serial, proc: 23, status: MessageStatus.Error }, err.encode());
      } else {
        peer.send({ serial: p.header.serial, proc: p.header.proc }, Buffer.alloc(4));
      }
    };
    const rpc = new RpcClient(peer.client, { keepalive: false });
    const err = await rpc.call(23).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(LibvirtError);
    expect(err).toMatchObject({ code: 42, domain: 10, level: 2, message: "Domain not found: 'nope'" });
    expect((await rpc.call(59)).length).toBe(4);
    rpc.close();
  });

  it('on abort stops waiting, keeps the connection, and drops the late reply', async () => {
    const peer = new FakePeer();
    const rpc = new RpcClient(peer.client, { keepalive: false });
    const ac = new AbortController();
    const slow = rpc.call(9, undefined, { signal: ac.signal });
    await peer.waitFor((ps) => ps.length === 1);
    ac.abort(new Error('deadline'));
    await expect(slow).rejects.toThrow('deadline');
    const fast = rpc.call(59);
    await peer.waitFor((ps) => ps.length === 2);
    peer.send({ serial: peer.received[0]!.header.serial, proc: 9 }, Buffer.from('late'));
    peer.send({ serial: peer.received[1]!.header.serial, proc: 59 }, Buffer.from('ok'));
    expect((await fast).toString()).toBe('ok');
    expect(rpc.stats.lateRepliesDiscarded).toBe(1);
    expect(rpc.isOpen).toBe(true);
    // an already-aborted signal sends nothing
    await expect(rpc.call(59, undefined, { signal: AbortSignal.abort(new Error('gone')) })).rejects.toThrow(
      'gone',
    );
    await flush();
    expect(peer.received.length).toBe(2);
    rpc.close();
  });

  it('answers the peer PING with a PONG', async () => {
    const peer = new FakePeer();
    const rpc = new RpcClient(peer.client, { keepalive: false });
    peer.send({ prog: KEEPALIVE_PROGRAM, proc: KEEPALIVE_PROC_PING, type: MessageType.Message, serial: 0 });
    await peer.waitFor((ps) => ps.length === 1);
    expect(peer.received[0]!.header).toMatchObject({
      prog: KEEPALIVE_PROGRAM,
      proc: KEEPALIVE_PROC_PONG,
      type: MessageType.Message,
      serial: 0,
    });
    expect(rpc.stats.pingsReceived).toBe(1);
    rpc.close();
  });

  it('declares a silent peer dead after `count` unanswered PINGs and fails pending calls', async () => {
    const clock = new FakeClock();
    const peer = new FakePeer();
    const rpc = new RpcClient(peer.client, { clock, keepalive: { intervalMs: 1000, count: 3 } });
    const closed = new Promise<Error | undefined>((r) => rpc.onClose(r));
    const pending = rpc.call(59);
    for (let i = 0; i < 3; i++) {
      clock.advance(1000);
      await flush();
    }
    expect(rpc.isOpen).toBe(true);
    expect(peer.received.filter((p) => p.header.prog === KEEPALIVE_PROGRAM).length).toBe(3);
    clock.advance(1000);
    await expect(pending).rejects.toBeInstanceOf(RpcConnectionError);
    await expect(pending).rejects.toThrow(/keepalive/);
    expect((await closed)?.message).toMatch(/dead/);
    expect(rpc.isOpen).toBe(false);
    await expect(rpc.call(59)).rejects.toBeInstanceOf(RpcConnectionError);
  });

  it('stays alive while the peer answers PINGs, and sends none while traffic flows', async () => {
    const clock = new FakeClock();
    const peer = new FakePeer();
    peer.onPacket = (p) => {
      if (p.header.prog === KEEPALIVE_PROGRAM && p.header.proc === KEEPALIVE_PROC_PING) {
        peer.send({
          prog: KEEPALIVE_PROGRAM,
          proc: KEEPALIVE_PROC_PONG,
          type: MessageType.Message,
          serial: 0,
        });
      }
    };
    const rpc = new RpcClient(peer.client, { clock, keepalive: { intervalMs: 1000, count: 2 } });
    for (let i = 0; i < 10; i++) {
      clock.advance(1000);
      await flush();
      await flush();
    }
    expect(rpc.isOpen).toBe(true);
    expect(rpc.stats.pongsReceived).toBeGreaterThanOrEqual(5);
    rpc.close();
  });

  it('fails pending calls when the peer goes away', async () => {
    const peer = new FakePeer();
    const rpc = new RpcClient(peer.client, { keepalive: false });
    const closed = new Promise<Error | undefined>((r) => rpc.onClose(r));
    const pending = rpc.call(59);
    await peer.waitFor((ps) => ps.length === 1);
    peer.side.destroy();
    await expect(pending).rejects.toBeInstanceOf(RpcConnectionError);
    expect(await closed).toBeInstanceOf(RpcConnectionError);
  });

  it('closes on a corrupt packet length', async () => {
    const peer = new FakePeer();
    const rpc = new RpcClient(peer.client, { keepalive: false });
    const pending = rpc.call(59);
    peer.side.write(Buffer.from('00000003deadbeef', 'hex'));
    const err = await pending.catch((e: unknown) => e);
    expect(err).toBeInstanceOf(RpcConnectionError);
    expect((err as Error).cause).toBeInstanceOf(RpcProtocolError);
  });

  it('uploads as CONTINUE packets of at most 256 KiB, then a finish, and waits for the ack', async () => {
    const peer = new FakePeer();
    peer.onPacket = (p) => {
      if (p.header.type === MessageType.Call) peer.send({ serial: p.header.serial, proc: p.header.proc });
      if (p.header.type === MessageType.Stream && p.header.status === MessageStatus.Ok) {
        peer.send({ serial: p.header.serial, proc: p.header.proc, type: MessageType.Stream });
      }
    };
    const rpc = new RpcClient(peer.client, { keepalive: false });
    const data = randomBytes(STREAM_CHUNK_SIZE * 2 + 100);
    await rpc.upload(208, Buffer.from('args'), [data.subarray(0, 10), data.subarray(10)]);
    const stream = peer.received.filter((p) => p.header.type === MessageType.Stream);
    const chunks = stream.filter((p) => p.header.status === MessageStatus.Continue);
    expect(chunks.every((p) => p.body.length <= STREAM_CHUNK_SIZE)).toBe(true);
    expect(Buffer.concat(chunks.map((p) => p.body)).equals(data)).toBe(true);
    expect(stream.at(-1)!.header.status).toBe(MessageStatus.Ok);
    expect(new Set(peer.received.map((p) => p.header.serial)).size).toBe(1);
    rpc.close();
  });

  it('fails an upload the daemon rejects mid-stream, and the connection survives', async () => {
    const peer = new FakePeer();
    peer.onPacket = (p) => {
      if (p.header.type === MessageType.Call) peer.send({ serial: p.header.serial, proc: p.header.proc });
      if (p.header.type === MessageType.Stream && p.header.status === MessageStatus.Continue) {
        const err = new LibvirtError({ code: 38, domain: 18, level: 2, message: 'No space left on device' });
        peer.send(
          {
            serial: p.header.serial,
            proc: p.header.proc,
            type: MessageType.Stream,
            status: MessageStatus.Error,
          },
          err.encode(),
        );
      }
    };
    const rpc = new RpcClient(peer.client, { keepalive: false });
    async function* slowly() {
      for (let i = 0; i < 50; i++) {
        yield randomBytes(1000);
        await flush();
      }
    }
    await expect(rpc.upload(208, Buffer.alloc(0), slowly())).rejects.toThrow('No space left on device');
    expect(rpc.isOpen).toBe(true);
    rpc.close();
  });

  it('aborts a stream that libvirtd opens after the caller gave up', async () => {
    const peer = new FakePeer();
    const rpc = new RpcClient(peer.client, { keepalive: false });
    const ac = new AbortController();
    const up = rpc.upload(208, Buffer.alloc(0), Buffer.alloc(10), { signal: ac.signal });
    await peer.waitFor((ps) => ps.length === 1);
    ac.abort(new Error('deadline'));
    await expect(up).rejects.toThrow('deadline');
    const call = peer.received[0]!.header;
    peer.send({ serial: call.serial, proc: call.proc }); // the late "stream open" reply
    await peer.waitFor((ps) => ps.length === 2);
    expect(peer.received[1]!.header).toMatchObject({
      serial: call.serial,
      type: MessageType.Stream,
      status: MessageStatus.Error,
    });
    expect(peer.received.some((p) => p.header.status === MessageStatus.Continue)).toBe(false);
    expect(rpc.isOpen).toBe(true);
    rpc.close();
  });

  it('downloads until the empty data packet, then finishes the stream', async () => {
    const peer = new FakePeer();
    const data = [randomBytes(5000), randomBytes(7)];
    peer.onPacket = (p) => {
      const base = { serial: p.header.serial, proc: p.header.proc };
      if (p.header.type === MessageType.Call) {
        peer.send(base);
        for (const d of data)
          peer.send({ ...base, type: MessageType.Stream, status: MessageStatus.Continue }, d);
        peer.send({ ...base, type: MessageType.Stream, status: MessageStatus.Continue });
      } else if (p.header.type === MessageType.Stream && p.header.status === MessageStatus.Ok) {
        peer.send({ ...base, type: MessageType.Stream, status: MessageStatus.Ok });
      }
    };
    const rpc = new RpcClient(peer.client, { keepalive: false });
    const got: Buffer[] = [];
    for await (const chunk of rpc.download(209, Buffer.alloc(0))) got.push(chunk);
    expect(Buffer.concat(got).equals(Buffer.concat(data))).toBe(true);
    expect(peer.received.at(-1)!.header).toMatchObject({
      type: MessageType.Stream,
      status: MessageStatus.Ok,
    });
    rpc.close();
  });
});

describe('known_hosts', () => {
  const blob = (type = 'ssh-ed25519') => {
    const { publicKey } = generateKeyPairSync('ed25519');
    const raw = publicKey.export({ format: 'der', type: 'spki' }).subarray(-32);
    const t = Buffer.from(type);
    const b = Buffer.alloc(8 + t.length + 32);
    b.writeUInt32BE(t.length, 0);
    t.copy(b, 4);
    b.writeUInt32BE(32, 4 + t.length);
    raw.copy(b, 8 + t.length);
    return b;
  };

  it('matches plain, [host]:port, wildcard and hashed entries', () => {
    const k1 = blob();
    const k2 = blob();
    const k3 = blob();
    const kh = parseKnownHosts(
      [
        '# comment',
        '',
        `kvm1.example.com,10.0.0.1 ssh-ed25519 ${k1.toString('base64')} root@kvm1`,
        `[kvm2.example.com]:2222 ssh-ed25519 ${k2.toString('base64')}`,
        `*.lab.example.com,!bad.lab.example.com ssh-ed25519 ${k3.toString('base64')}`,
      ].join('\n'),
    );
    expect(kh.verify('kvm1.example.com', 22, k1).ok).toBe(true);
    expect(kh.verify('10.0.0.1', 22, k1).ok).toBe(true);
    expect(kh.verify('KVM1.example.com', 22, k1).ok).toBe(true);
    expect(kh.verify('kvm2.example.com', 2222, k2).ok).toBe(true);
    expect(kh.verify('kvm2.example.com', 22, k2)).toMatchObject({ ok: false, why: 'unknown-host' });
    expect(kh.verify('kvm1.example.com', 2200, k1)).toMatchObject({ ok: false, why: 'unknown-host' });
    expect(kh.verify('a.lab.example.com', 22, k3).ok).toBe(true);
    expect(kh.verify('bad.lab.example.com', 22, k3).ok).toBe(false);
    expect(kh.verify('kvm1.example.com', 22, k2)).toMatchObject({ ok: false, why: 'key-mismatch' });
  });

  it('matches hashed names the way OpenSSH writes them', () => {
    const k = blob();
    const salt = randomBytes(20);
    const expected = createHmac('sha1', salt).update('[10.1.2.3]:2222').digest('base64');
    const hashed = hashKnownHostName('[10.1.2.3]:2222', salt);
    expect(hashed).toBe(`|1|${salt.toString('base64')}|${expected}`);
    const kh = parseKnownHosts(`${hashed} ssh-ed25519 ${k.toString('base64')}\n`);
    expect(kh.verify('10.1.2.3', 2222, k).ok).toBe(true);
    expect(kh.verify('10.1.2.4', 2222, k).ok).toBe(false);
  });

  it('honours @revoked and ignores @cert-authority lines for plain key matching', () => {
    const k = blob();
    const kh = parseKnownHosts(
      `kvm1 ssh-ed25519 ${k.toString('base64')}\n@revoked kvm1 ssh-ed25519 ${k.toString('base64')}\n` +
        `@cert-authority *.example ssh-ed25519 ${blob().toString('base64')}\n`,
    );
    expect(kh.verify('kvm1', 22, k)).toMatchObject({ ok: false, why: 'revoked' });
    expect(kh.verify('x.example', 22, blob())).toMatchObject({ ok: false, why: 'unknown-host' });
  });

  it('offers only the host key algorithms known_hosts can verify for that host', () => {
    const kh = parseKnownHosts(
      `[h]:2222 ssh-ed25519 ${blob().toString('base64')}\n[h]:2222 ssh-rsa ${blob('ssh-rsa').toString('base64')}\n` +
        `other ecdsa-sha2-nistp256 ${blob('ecdsa-sha2-nistp256').toString('base64')}\n`,
    );
    expect(kh.hostKeyAlgorithms('h', 2222)).toEqual([
      'ssh-ed25519',
      'rsa-sha2-512',
      'rsa-sha2-256',
      'ssh-rsa',
    ]);
    expect(kh.hostKeyAlgorithms('other', 22)).toEqual(['ecdsa-sha2-nistp256']);
    expect(kh.hostKeyAlgorithms('h', 22)).toBeUndefined();
  });

  it('names the line of a malformed entry', () => {
    const good = `h ssh-ed25519 ${blob().toString('base64')}`;
    const cases = [
      `${good}\nonlyhost\n`,
      `${good}\nh ssh-ed25519 !!!notbase64\n`,
      `${good}\nh ssh-rsa ${blob().toString('base64')}\n`,
      `${good}\n@weird h ssh-ed25519 ${blob().toString('base64')}\n`,
    ];
    for (const text of cases) {
      let err: unknown;
      try {
        parseKnownHosts(text);
      } catch (e) {
        err = e;
      }
      expect(err).toBeInstanceOf(SshError);
      expect((err as SshError).reason).toBe('SSHMaterialInvalid');
      expect((err as Error).message).toContain('line 2');
    }
  });
});
