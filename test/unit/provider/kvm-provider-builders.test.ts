/**
 * The kvm provider's pure builders: providerIDs, domain and volume XML, our metadata element
 * (round trip, escaping, libvirt's re-quoting), state mapping, address choice, image resolution
 * and the health-check reason of each failure step.
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { redactUrl } from '../../../src/api/url.ts';
import { kvmWithDefaults } from '../../../src/config/defaults.ts';
import { classify } from '../../../src/provider/errors.ts';
import { checkReason } from '../../../src/provider/kvm/check.ts';
import {
  backingPathOf,
  baseVolumesOf,
  type DomainSpec,
  domainXml,
  instanceState,
  METADATA_NAMESPACE,
  metadataXml,
  overlayVolumeXml,
  parseMetadata,
  parseProviderID,
  pickAddress,
  providerIDOf,
  rawVolumeXml,
  usableAddress,
  xmlEscape,
} from '../../../src/provider/kvm/domain.ts';
import { resolveImage } from '../../../src/provider/kvm/image.ts';
import { createKvmProvider } from '../../../src/provider/kvm/index.ts';
import { DomainState, ErrorCode } from '../../../src/provider/kvm/libvirt.ts';
import { splitHostPort } from '../../../src/provider/kvm/pool.ts';
import { LibvirtError, RpcConnectionError } from '../../../src/provider/kvm/rpc.ts';
import { SshError } from '../../../src/provider/kvm/ssh.ts';
import { captureLog } from '../../support/log.ts';
import { until } from '../../support/wait.ts';

const created = new Date('2026-01-02T03:04:05.000Z');

function spec(over: Partial<DomainSpec> = {}): DomainSpec {
  return {
    name: 'px-0123456789abcdef-0123456789',
    domainType: 'kvm',
    firmware: 'uefi',
    vcpus: 2,
    memoryMiB: 1024,
    pool: 'default',
    overlayVolume: 'px-0123456789abcdef-0123456789.qcow2',
    seedVolume: 'px-0123456789abcdef-0123456789-seed.iso',
    bridge: 'br0',
    metadata: { uid: 'uid-1', namespace: 'team-a', proxyName: 'p1', createdAt: created },
    ...over,
  };
}

describe('providerID', () => {
  it('round-trips hosts/<host>/domains/<name>', () => {
    const id = providerIDOf({ host: 'nas1', name: 'px-abc' });
    expect(id).toBe('hosts/nas1/domains/px-abc');
    expect(parseProviderID(id, 'kvm-home')).toEqual({ host: 'nas1', name: 'px-abc' });
  });

  it.each([
    '',
    'hosts/nas1',
    'hosts/nas1/domains',
    'hosts/nas1/domains/',
    'hosts//domains/px',
    'host/nas1/domains/px',
    'hosts/nas1/vms/px',
    'hosts/nas1/domains/px/extra',
    'hosts/nas 1/domains/px',
    'hosts/nas1/domains/-px',
    'namespaces/ns/pods/px',
  ])('rejects %j as Permanent', (id) => {
    let caught: unknown;
    try {
      parseProviderID(id, 'kvm-home');
    } catch (err) {
      caught = err;
    }
    expect(classify(caught)).toBe('Permanent');
    expect((caught as Error).message).toContain('hosts/<host>/domains/<name>');
  });
});

describe('domainXml', () => {
  it('builds a KVM domain with UEFI (secure boot off), virtio disk, seed cdrom and a bridge NIC', () => {
    const xml = domainXml(spec());
    expect(xml).toMatch(/^<domain type='kvm'>/);
    expect(xml).toContain("<os firmware='efi'>");
    expect(xml).toContain("<feature enabled='no' name='secure-boot'/>");
    expect(xml).toContain("<cpu mode='host-passthrough'/>");
    expect(xml).toContain('<vcpu>2</vcpu>');
    expect(xml).toContain("<memory unit='MiB'>1024</memory>");
    expect(xml).toMatch(
      /<disk type='volume' device='disk'>[\s\S]*?<source pool='default' volume='px-0123456789abcdef-0123456789.qcow2'\/>[\s\S]*?<target dev='vda' bus='virtio'\/>/,
    );
    expect(xml).toMatch(
      /<disk type='volume' device='cdrom'>[\s\S]*?volume='px-0123456789abcdef-0123456789-seed.iso'[\s\S]*?<readonly\/>/,
    );
    expect(xml).toMatch(/<interface type='bridge'>\s*<source bridge='br0'\/>\s*<model type='virtio'\/>/);
    expect(xml).toContain("<serial type='pty'>");
    expect(xml).toContain("<console type='pty'><target type='serial' port='0'/></console>");
    expect(xml).toContain("<target type='virtio' name='org.qemu.guest_agent.0'/>");
    expect(xml).toContain("<rng model='virtio'>");
    expect(xml).toContain("<memballoon model='none'/>");
  });

  it('uses BIOS when the image says so, and type qemu without host CPU passthrough for TCG', () => {
    const xml = domainXml(spec({ firmware: 'bios', domainType: 'qemu' }));
    expect(xml).toMatch(/^<domain type='qemu'>/);
    expect(xml).not.toContain('firmware=');
    expect(xml).not.toContain('secure-boot');
    expect(xml).not.toContain('host-passthrough');
  });

  it('boots the kernel, initrd and command line directly when the image names them, instead of the disk', () => {
    const xml = domainXml(
      spec({
        firmware: 'bios',
        directBoot: {
          kernel: '/srv/k/vmlinuz',
          initrd: '/srv/k/initrd.img',
          cmdline: "root=/dev/vda rw a='b'",
        },
      }),
    );
    expect(xml).toMatch(
      /<os>\s*<type arch='x86_64' machine='q35'>hvm<\/type>\s*<kernel>\/srv\/k\/vmlinuz<\/kernel>\s*<initrd>\/srv\/k\/initrd.img<\/initrd>\s*<cmdline>root=\/dev\/vda rw a=&apos;b&apos;<\/cmdline>\s*<\/os>/,
    );
    expect(xml).not.toContain('<boot ');
    const kernelOnly = domainXml(spec({ directBoot: { kernel: '/k' } }));
    expect(kernelOnly).toContain('<kernel>/k</kernel>');
    expect(kernelOnly).not.toContain('<initrd>');
    expect(kernelOnly).not.toContain('<cmdline>');
    expect(kernelOnly).toContain("<os firmware='efi'>");
    expect(domainXml(spec())).toContain("<boot dev='hd'/>");
    expect(domainXml(spec())).not.toContain('<kernel>');
  });

  it('replaces the NIC with the test-only interface XML', () => {
    const xml = domainXml(spec({ interfaceXml: "<interface type='user'/>" }));
    expect(xml).toContain("<interface type='user'/>");
    expect(xml).not.toContain("type='bridge'");
  });

  it('escapes every configured and requested value', () => {
    const evil = `x'/><evil a="1">&`;
    const xml = domainXml(
      spec({
        bridge: evil,
        pool: evil,
        metadata: { uid: evil, namespace: evil, proxyName: evil, createdAt: created },
      }),
    );
    expect(xml).not.toContain('<evil');
    expect(xml).toContain(xmlEscape(evil));
    expect(parseMetadata(xml)).toMatchObject({ uid: evil, namespace: evil, proxyName: evil });
  });
});

describe('metadata', () => {
  it('round-trips managed, uid, namespace and createdAt', () => {
    expect(parseMetadata(domainXml(spec()))).toEqual({
      managed: true,
      uid: 'uid-1',
      namespace: 'team-a',
      proxyName: 'p1',
      createdAt: created,
    });
  });

  it('round-trips the installation id; a domain from before installations has none', () => {
    const labelled = spec();
    labelled.metadata = { ...labelled.metadata, installation: 'installation-a' };
    expect(parseMetadata(domainXml(labelled))).toMatchObject({
      installation: 'installation-a',
      uid: 'uid-1',
    });
    expect(parseMetadata(domainXml(spec())).installation).toBeUndefined();
  });

  it('reads the element as libvirt returns it (double quotes, other whitespace)', () => {
    const ours = metadataXml({ uid: 'u', namespace: 'n', proxyName: 'p', createdAt: created }).replaceAll(
      "'",
      '"',
    );
    const dumped = `<domain type="kvm"><name>x</name><metadata>\n    <other:thing xmlns:other="urn:x"><other:managed>false</other:managed></other:thing>\n    ${ours}\n  </metadata></domain>`;
    expect(parseMetadata(dumped)).toMatchObject({ managed: true, uid: 'u', namespace: 'n' });
  });

  it('is not managed without our element, or with our tag in another namespace', () => {
    expect(parseMetadata("<domain type='kvm'><name>x</name></domain>").managed).toBe(false);
    const foreign = `<domain><metadata><epo:proxy xmlns:epo="urn:other"><epo:managed>true</epo:managed></epo:proxy></metadata></domain>`;
    expect(parseMetadata(foreign).managed).toBe(false);
    expect(METADATA_NAMESPACE).toMatch(/^https:\/\//);
  });
});

describe('volume XML', () => {
  it('builds a qcow2 overlay backed by the cached base image', () => {
    const xml = overlayVolumeXml({
      name: 'px-a.qcow2',
      capacityGb: 10,
      backingPath: '/var/lib/libvirt/images/base-debian.qcow2',
      backingFormat: 'qcow2',
    });
    expect(xml).toContain('<name>px-a.qcow2</name>');
    expect(xml).toContain("<capacity unit='GiB'>10</capacity>");
    expect(xml).toContain("<target><format type='qcow2'/></target>");
    expect(xml).toMatch(
      /<backingStore>\s*<path>\/var\/lib\/libvirt\/images\/base-debian.qcow2<\/path>\s*<format type='qcow2'\/>/,
    );
  });

  it('builds a raw volume of an exact byte size', () => {
    expect(rawVolumeXml('px-a-seed.iso', 378880)).toContain("<capacity unit='bytes'>378880</capacity>");
  });
});

describe('state and address', () => {
  it('maps libvirt states; running without an address is Pending', () => {
    expect(instanceState(DomainState.RUNNING, true)).toBe('Running');
    expect(instanceState(DomainState.RUNNING, false)).toBe('Pending');
    expect(instanceState(DomainState.NOSTATE, false)).toBe('Pending');
    expect(instanceState(DomainState.SHUTDOWN, true)).toBe('Stopping');
    expect(instanceState(DomainState.SHUTOFF, false)).toBe('Stopped');
    expect(instanceState(DomainState.PAUSED, false)).toBe('Stopped');
    expect(instanceState(DomainState.CRASHED, false)).toBe('Terminated');
    expect(instanceState(99, false)).toBe('Unknown');
  });

  it('ignores loopback and link-local addresses and prefers IPv4', () => {
    const ifaces = [
      {
        addrs: [
          { type: 0, addr: '127.0.0.1' },
          { type: 1, addr: '::1' },
        ],
      },
      {
        addrs: [
          { type: 1, addr: 'fe80::5054:ff:fe12:3456' },
          { type: 1, addr: '2001:db8::5' },
          { type: 0, addr: '169.254.3.4' },
          { type: 0, addr: '192.168.1.50' },
        ],
      },
    ];
    expect(pickAddress(ifaces)).toBe('192.168.1.50');
    expect(pickAddress([ifaces[1] ?? { addrs: [] }].map((i) => ({ addrs: i.addrs.slice(0, 3) })))).toBe(
      '2001:db8::5',
    );
    expect(pickAddress([ifaces[0] ?? { addrs: [] }])).toBeUndefined();
    expect(usableAddress('10.0.0.1')).toBe(true);
  });
});

describe('resolveImage', () => {
  const images = kvmWithDefaults({
    sshKeyFile: '/k',
    machineTypes: { small: { vcpus: 1, memoryMiB: 512 } },
    hosts: [],
    images: { debian: { url: 'https://img.example/debian.qcow2', sha256: 'a'.repeat(64) } },
  }).images;

  it('finds a configured key (with defaults), a URL, or the only image', () => {
    expect(resolveImage(images, 'debian')).toEqual({
      key: 'debian',
      volume: `base-debian-sha256-${'a'.repeat(16)}.qcow2`,
      url: 'https://img.example/debian.qcow2',
      sha256: 'a'.repeat(64),
      format: 'qcow2',
      firmware: 'uefi',
    });
    expect(resolveImage(images, undefined).key).toBe('debian');
    const direct = { ...images.debian!, kernel: '/v', initrd: '/i', cmdline: 'root=/dev/vda' };
    expect(resolveImage({ debian: direct }, 'debian').directBoot).toEqual({
      kernel: '/v',
      initrd: '/i',
      cmdline: 'root=/dev/vda',
    });
    expect(resolveImage({ debian: { ...images.debian!, kernel: '/v' } }, 'debian').directBoot).toEqual({
      kernel: '/v',
    });
    const byUrl = resolveImage(images, 'https://img.example/other.img');
    expect(byUrl.key).toMatch(/^url-[0-9a-f]{16}$/);
    expect(resolveImage(images, 'https://img.example/other.img').key).toBe(byUrl.key);
  });

  it('names bases by content: a new checksum or URL is a new volume, the same image the same one', () => {
    const img = images.debian!;
    const volumeOf = (over: Partial<typeof img>) =>
      resolveImage({ debian: { ...img, ...over } }, 'debian').volume;
    expect(volumeOf({})).toBe(volumeOf({ sha256: 'A'.repeat(64) }));
    expect(volumeOf({ sha256: 'b'.repeat(64) })).toBe(`base-debian-sha256-${'b'.repeat(16)}.qcow2`);
    const noSum = volumeOf({ sha256: undefined });
    expect(noSum).toMatch(/^base-debian-url-[0-9a-f]{16}\.qcow2$/);
    expect(volumeOf({ sha256: undefined, url: 'https://img.example/debian-13.qcow2' })).not.toBe(noSum);
    expect(volumeOf({ format: 'raw' })).toBe(`base-debian-sha256-${'a'.repeat(16)}.raw`);
    const byUrl = resolveImage(images, 'https://img.example/other.img');
    expect(byUrl.volume).toBe(`base-${byUrl.key}.qcow2`);
    // Every version of a key, and the older unversioned name, belong to that key only.
    const of = baseVolumesOf('debian');
    for (const v of [volumeOf({}), noSum, 'base-debian.qcow2']) expect(of.test(v)).toBe(true);
    for (const v of [
      'base-debian-12-sha256-aaaaaaaaaaaaaaaa.qcow2',
      'base-debian.qcow2.sha256',
      'px-1.qcow2',
    ])
      expect(of.test(v)).toBe(false);
  });

  it('reads the backing file of an overlay from its volume XML', () => {
    const xml = overlayVolumeXml({
      name: 'px.qcow2',
      capacityGb: 1,
      backingPath: "/p/base-a&b's.qcow2",
      backingFormat: 'qcow2',
    });
    expect(backingPathOf(xml)).toBe("/p/base-a&b's.qcow2");
    expect(
      backingPathOf('<volume><name>x</name><target><path>/p/x</path></target></volume>'),
    ).toBeUndefined();
  });

  it('rejects an unknown key and a missing image among several', () => {
    expect(() => resolveImage(images, 'ubuntu')).toThrow(/neither a key of kvm.images nor an http\(s\) URL/);
    expect(() =>
      resolveImage({ ...images, two: { ...images.debian!, url: 'https://x/y' } }, undefined),
    ).toThrow(/placement.image is required/);
  });

  it('keeps tokens out of messages', () => {
    expect(redactUrl('https://user:secret@img.example/a.qcow2?token=abc')).toBe(
      'https://img.example/a.qcow2',
    );
  });
});

describe('checkReason', () => {
  const live = new AbortController().signal;
  const lv = (code: number) => new LibvirtError({ code, domain: 0, level: 2, message: 'x' });

  it('names the failed step', () => {
    expect(checkReason(new SshError('SSHMaterialUnavailable', 'x'), live)).toBe('SSHMaterialUnavailable');
    expect(checkReason(new Error('wrapped', { cause: new SshError('SSHMaterialInvalid', 'x') }), live)).toBe(
      'SSHMaterialUnavailable',
    );
    expect(checkReason(new SshError('Unreachable', 'x'), live)).toBe('Unreachable');
    expect(checkReason(new SshError('SSHHandshakeFailed', 'x'), live)).toBe('SSHHandshakeFailed');
    expect(checkReason(new SshError('LibvirtConnectFailed', 'x'), live)).toBe('LibvirtConnectFailed');
    expect(checkReason(lv(ErrorCode.NO_STORAGE_POOL), live)).toBe('PoolNotFound');
    expect(checkReason(lv(ErrorCode.INTERNAL_ERROR), live)).toBe('LibvirtError');
    expect(checkReason(new RpcConnectionError('closed'), live)).toBe('Unreachable');
    expect(checkReason(new Error('aborted'), AbortSignal.abort())).toBe('Timeout');
  });
});

describe('splitHostPort', () => {
  it('splits host:port and [v6]:port', () => {
    expect(splitHostPort('nas1.lan:22')).toEqual({ host: 'nas1.lan', port: 22 });
    expect(splitHostPort('[2001:db8::1]:2222')).toEqual({ host: '2001:db8::1', port: 2222 });
  });
});

describe('start-up check of the SSH material', () => {
  it('warns at construction, naming the file, when the key or known_hosts cannot be used', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'kvm-material-'));
    try {
      const knownHosts = join(dir, 'known_hosts');
      writeFileSync(knownHosts, 'this is not a known_hosts line\n');
      const captured = captureLog('info');
      const p = createKvmProvider({
        name: 'kvm-a',
        log: captured.log,
        config: {
          sshKeyFile: join(dir, 'missing-key'),
          knownHostsFile: knownHosts,
          machineTypes: { small: { vcpus: 1, memoryMiB: 64 } },
          hosts: [{ name: 'h1', address: '127.0.0.1:22', user: 'virt', bridge: 'br0' }],
        },
      });
      try {
        const warnings = await until('both start-up warnings', () => {
          const w = captured.lines.filter((l) => l.level === 40);
          return w.length === 2 && w;
        });
        expect(warnings).toEqual(
          expect.arrayContaining([
            expect.objectContaining({ file: join(dir, 'missing-key'), reason: 'SSHMaterialUnavailable' }),
            expect.objectContaining({ file: knownHosts, reason: 'SSHMaterialInvalid' }),
          ]),
        );
        for (const w of warnings) expect(String(w.msg)).toMatch(/^WARNING: kvm /);
      } finally {
        await p.close();
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
