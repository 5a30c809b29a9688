/**
 * The per-call libvirt trace: every method of LibvirtConnection logs one debug line when its
 * call settles and its arguments at trace level, and never the XML, volume bytes or cloud-init
 * it carries. Against a scripted peer that refuses every call, so no libvirtd is needed.
 */
import { duplexPair } from 'node:stream';
import { describe, expect, it } from 'vitest';
import {
  type DomainRef,
  LibvirtConnection,
  type PoolRef,
  type VolRef,
} from '../../../src/provider/kvm/libvirt.ts';
import {
  encodePacket,
  LibvirtError,
  MessageStatus,
  MessageType,
  PacketDecoder,
  REMOTE_PROGRAM,
  RpcClient,
} from '../../../src/provider/kvm/rpc.ts';
import { FakeClock } from '../../support/clock.ts';
import { captureLog } from '../../support/log.ts';

const SECRET_XML = '<domain><password>hunter2-in-xml</password></domain>';
const SECRET_UPLOAD = '#cloud-config\nchpasswd: {list: "proxy:hunter2-in-cloud-init"}';

const dom: DomainRef = { name: 'px-dom', uuid: Buffer.alloc(16, 1), id: -1 };
const pool: PoolRef = { name: 'px-pool', uuid: Buffer.alloc(16, 2) };
const vol: VolRef = { pool: 'px-pool', name: 'px-vol', key: '/var/lib/px-vol' };

/** How to call each method; a method missing here fails the test, so new ones get traced too. */
const calls: Record<string, (c: LibvirtConnection) => Promise<unknown>> = {
  authList: (c) => c.authList(),
  supportsFeature: (c) => c.supportsFeature(1),
  connectOpen: (c) => c.connectOpen('qemu:///system', 0),
  getHostname: (c) => c.getHostname(),
  getLibVersion: (c) => c.getLibVersion(),
  getVersion: (c) => c.getVersion(),
  getCapabilities: (c) => c.getCapabilities(),
  storagePoolLookupByName: (c) => c.storagePoolLookupByName('px-pool'),
  storagePoolGetInfo: (c) => c.storagePoolGetInfo(pool),
  storagePoolIsActive: (c) => c.storagePoolIsActive(pool),
  storagePoolRefresh: (c) => c.storagePoolRefresh(pool),
  storagePoolListAllVolumes: (c) => c.storagePoolListAllVolumes(pool),
  storageVolLookupByName: (c) => c.storageVolLookupByName(pool, 'px-vol'),
  storageVolCreateXml: (c) => c.storageVolCreateXml(pool, SECRET_XML),
  storageVolDelete: (c) => c.storageVolDelete(vol),
  storageVolGetInfo: (c) => c.storageVolGetInfo(vol),
  storageVolGetXmlDesc: (c) => c.storageVolGetXmlDesc(vol),
  storageVolGetPath: (c) => c.storageVolGetPath(vol),
  storageVolUpload: (c) => c.storageVolUpload(vol, Buffer.from(SECRET_UPLOAD)),
  storageVolDownload: async (c) => {
    for await (const _ of c.storageVolDownload(vol)) {
      // the peer refuses the stream before any data
    }
  },
  domainDefineXml: (c) => c.domainDefineXml(SECRET_XML),
  domainLookupByName: (c) => c.domainLookupByName('px-dom'),
  domainCreate: (c) => c.domainCreate(dom),
  domainDestroy: (c) => c.domainDestroy(dom),
  domainShutdown: (c) => c.domainShutdown(dom),
  domainUndefine: (c) => c.domainUndefine(dom),
  domainGetState: (c) => c.domainGetState(dom),
  domainIsActive: (c) => c.domainIsActive(dom),
  domainGetXmlDesc: (c) => c.domainGetXmlDesc(dom),
  domainInterfaceAddresses: (c) => c.domainInterfaceAddresses(dom, 1),
  listAllDomains: (c) => c.listAllDomains(),
  // last: it ends the connection
  close: (c) => c.close(),
};

/** Not calls: accessors and the tracing plumbing itself. */
const NOT_CALLS = new Set([
  'constructor',
  'isOpen',
  'onClose',
  'traced',
  'tracedStream',
  'invoke',
  'invokeVoid',
]);

/** A libvirtd that answers every call with "operation failed". */
function refusingPeer() {
  const [client, side] = duplexPair();
  const decoder = new PacketDecoder();
  side.on('data', (chunk: Buffer) => {
    for (const p of decoder.push(chunk)) {
      if (p.header.type !== MessageType.Call) continue;
      const err = new LibvirtError({ code: 9, domain: 0, level: 2, message: 'operation failed' });
      side.write(
        encodePacket(
          {
            prog: REMOTE_PROGRAM,
            vers: 1,
            proc: p.header.proc,
            type: MessageType.Reply,
            serial: p.header.serial,
            status: MessageStatus.Error,
          },
          err.encode(),
        ),
      );
    }
  });
  return client;
}

describe('libvirt call trace', () => {
  it('logs every method of the client once at debug, arguments at trace, and no secret', async () => {
    const methods = Object.getOwnPropertyNames(LibvirtConnection.prototype).filter((m) => !NOT_CALLS.has(m));
    expect(methods.filter((m) => !(m in calls))).toEqual([]);

    const captured = captureLog('trace');
    const clock = new FakeClock();
    const conn = new LibvirtConnection(
      new RpcClient(refusingPeer(), { keepalive: false, logger: captured.log, clock, label: 'kvm-a' }),
    );
    for (const call of Object.values(calls)) {
      await call(conn).catch(() => undefined);
    }

    const debug = captured.lines.filter((l) => l.level === 20 && l.libvirtCall !== undefined);
    expect(debug.map((l) => l.libvirtCall)).toEqual(Object.keys(calls));
    for (const l of debug) {
      expect(l).toMatchObject({ host: 'kvm-a', durationMs: 0 });
      // close swallows the refusal; every other call reports libvirt's error code
      if (l.libvirtCall !== 'close') expect(l.outcome).toBe('libvirt error 9');
    }
    const trace = captured.lines.filter((l) => l.level === 10 && l.libvirtCall !== undefined);
    expect(trace.map((l) => l.libvirtCall)).toEqual(Object.keys(calls));
    const traced = (m: string) => trace.find((l) => l.libvirtCall === m);
    expect(traced('domainInterfaceAddresses')).toMatchObject({ domain: 'px-dom', source: 1 });
    expect(traced('storageVolUpload')).toMatchObject({ vol: 'px-vol' });
    expect(traced('domainDefineXml')).toMatchObject({ xmlBytes: Buffer.byteLength(SECRET_XML) });

    const all = captured.raw.join('\n');
    expect(all).not.toContain('hunter2');
    expect(all).not.toContain('cloud-config');
  });

  it('logs an abandoned call as aborted after the time it waited', async () => {
    const captured = captureLog('debug');
    const clock = new FakeClock();
    const [client] = duplexPair(); // a peer that never answers
    const conn = new LibvirtConnection(
      new RpcClient(client, { keepalive: false, logger: captured.log, clock }),
    );
    const ac = new AbortController();
    const call = conn.domainInterfaceAddresses(dom, 1, { signal: ac.signal }).catch((e: unknown) => e);
    clock.advance(30_000);
    ac.abort(new DOMException('deadline', 'TimeoutError'));
    await call;
    expect(captured.lines.filter((l) => l.libvirtCall !== undefined)).toEqual([
      expect.objectContaining({
        libvirtCall: 'domainInterfaceAddresses',
        outcome: 'aborted',
        durationMs: 30_000,
      }),
    ]);
    conn.rpc.close();
  });
});
