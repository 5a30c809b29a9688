/**
 * The gateway CA (docs/gateway.md, "HTTPS inspection"): made once and kept (a 0600 key file, or
 * one Secret every replica reads), leaves for names and address literals that a client trusting
 * the CA accepts, cached per host with a bound.
 */
import { X509Certificate } from 'node:crypto';
import { chmodSync, mkdtempSync, readFileSync, statSync } from 'node:fs';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import tls from 'node:tls';
import { afterEach, describe, expect, it } from 'vitest';
import { CA_COMMON_NAME, FileCaStore, GatewayCa, SecretCaStore } from '../../../src/gateway/ca.ts';
import { createMemoryStore } from '../../../src/runtime/memory.ts';
import { FakeClock } from '../../support/clock.ts';

const servers: tls.Server[] = [];
afterEach(() => {
  for (const s of servers.splice(0)) s.close();
});

/** Handshakes with a server using `ca`'s leaf for `host`; resolves with what the client saw. */
async function handshake(ca: GatewayCa, host: string, servername?: string) {
  const server = tls.createServer({ SNICallback: (_n, cb) => cb(null, ca.contextFor(host)) }, (s) => s.end());
  servers.push(server);
  await new Promise<void>((r) => server.listen(0, host.includes(':') ? '::1' : '127.0.0.1', r));
  const port = (server.address() as AddressInfo).port;
  return new Promise<{ authorized: boolean; error?: string; subject: string; cert?: X509Certificate }>(
    (resolve) => {
      const s = tls.connect({
        host: host.includes(':') ? '::1' : '127.0.0.1',
        port,
        ca: ca.certPem,
        // An address literal is checked against the iPAddress entries; a name against dNSName.
        servername: servername ?? 'localhost',
        checkServerIdentity: (_h, cert) => tls.checkServerIdentity(host, cert),
        rejectUnauthorized: false,
      });
      s.once('secureConnect', () => {
        const peer = s.getPeerCertificate();
        const identity = tls.checkServerIdentity(host, peer);
        resolve({
          authorized: s.authorized && identity === undefined,
          ...(s.authorizationError ? { error: String(s.authorizationError) } : {}),
          subject: String(peer.subject.CN ?? ''),
          cert: new X509Certificate(peer.raw),
        });
        s.destroy();
      });
      s.once('error', (err) => resolve({ authorized: false, error: err.message, subject: '' }));
    },
  );
}

describe('gateway CA', () => {
  it('issues leaves a client trusting the CA accepts, for names and address literals', async () => {
    // Certificates are checked against the real time by the client: the clock starts there.
    const clock = new FakeClock(Date.now());
    const ca = await GatewayCa.open(new FileCaStore(mkdtempSync(join(tmpdir(), 'gwca-'))), () => clock.now());
    expect(new X509Certificate(ca.certPem).subject).toBe(`CN=${CA_COMMON_NAME}`);
    expect(await handshake(ca, 'shop.test', 'shop.test')).toMatchObject({
      authorized: true,
      subject: 'shop.test',
    });
    expect(await handshake(ca, '127.0.0.1')).toMatchObject({ authorized: true });
    expect(await handshake(ca, '::1')).toMatchObject({ authorized: true });
    // A leaf names its host only.
    const leaf = (await handshake(ca, 'a.test', 'a.test')).cert as X509Certificate;
    expect(leaf.checkHost('a.test')).toBe('a.test');
    expect(leaf.checkHost('b.test')).toBeUndefined();
    expect(leaf.checkIssued(new X509Certificate(ca.certPem))).toBe(true);
  });

  it('caches leaves per host, bounded, least recently used out first', async () => {
    const clock = new FakeClock();
    const dir = mkdtempSync(join(tmpdir(), 'gwca-'));
    await GatewayCa.open(new FileCaStore(dir), () => clock.now());
    const material = {
      certPem: readFileSync(join(dir, 'ca.pem'), 'utf8'),
      keyPem: readFileSync(join(dir, 'ca.key'), 'utf8'),
    };
    const ca = new GatewayCa(material, () => clock.now(), 2);
    const a = ca.contextFor('a.test');
    expect(ca.contextFor('a.test')).toBe(a);
    ca.contextFor('b.test');
    ca.contextFor('a.test'); // a is now the most recently used
    ca.contextFor('c.test'); // evicts b
    expect(ca.cached).toBe(2);
    expect(ca.contextFor('a.test')).toBe(a);
    // After a day a leaf is issued again (it is valid a week).
    clock.advance(86_400_000);
    expect(ca.contextFor('a.test')).not.toBe(a);
  });

  it('keeps the key in a 0600 file and reuses the CA across restarts', async () => {
    const dir = join(mkdtempSync(join(tmpdir(), 'gwca-')), 'gateway-ca');
    const first = await GatewayCa.open(new FileCaStore(dir), Date.now);
    expect(statSync(join(dir, 'ca.key')).mode & 0o777).toBe(0o600);
    expect(statSync(dir).mode & 0o777).toBe(0o700);
    expect(readFileSync(join(dir, 'ca.pem'), 'utf8')).toBe(first.certPem);
    chmodSync(join(dir, 'ca.key'), 0o644);
    const second = await GatewayCa.open(new FileCaStore(dir), Date.now);
    expect(second.certPem).toBe(first.certPem);
    expect(statSync(join(dir, 'ca.key')).mode & 0o777).toBe(0o600);
  });

  it('shares one CA through one Secret, whichever replica makes it', async () => {
    const store = createMemoryStore();
    const open = () =>
      GatewayCa.open(new SecretCaStore(store.secrets, 'ops', 'egress-proxies-gateway-ca'), Date.now);
    const [a, b] = await Promise.all([open(), open()]);
    const c = await open();
    expect(b.certPem).toBe(a.certPem);
    expect(c.certPem).toBe(a.certPem);
    const secret = await store.secrets.read({ namespace: 'ops', name: 'egress-proxies-gateway-ca' });
    expect(Object.keys(secret.data ?? {}).sort()).toEqual(['ca.key', 'ca.pem']);
  });

  it('refuses a key that does not belong to the certificate', async () => {
    const one = await GatewayCa.open(new FileCaStore(mkdtempSync(join(tmpdir(), 'gwca-'))), Date.now);
    const otherDir = mkdtempSync(join(tmpdir(), 'gwca-'));
    await GatewayCa.open(new FileCaStore(otherDir), Date.now);
    expect(
      () =>
        new GatewayCa(
          { certPem: one.certPem, keyPem: readFileSync(join(otherDir, 'ca.key'), 'utf8') },
          Date.now,
        ),
    ).toThrow(/does not belong/);
  });
});
