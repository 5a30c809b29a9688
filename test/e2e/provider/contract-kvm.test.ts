/**
 * The provider contract against the kvm provider on the real libvirtd + sshd that
 * scripts/ci/libvirt-up.sh starts (fails, never skips, when they are not up). The base image
 * is a tiny empty qcow2 served from loopback: domains run but never boot, so they stay Pending.
 */
import { execFileSync } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync } from 'node:fs';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createKvmProvider } from '../../../src/provider/kvm/index.ts';
import { ciName, requireLibvirt } from '../../support/libvirt.ts';
import { createRequest } from '../../support/provider-calls.ts';
import { providerContract } from '../../support/provider-contract.ts';

const tag = randomBytes(3).toString('hex');

providerContract(
  'kvm',
  async () => {
    const env = await requireLibvirt();
    const dir = mkdtempSync(join(tmpdir(), 'kvm-contract-'));
    execFileSync('qemu-img', ['create', '-q', '-f', 'qcow2', join(dir, 'tiny.qcow2'), '64M']);
    const image = readFileSync(join(dir, 'tiny.qcow2'));
    const server = createServer((_req, res) => res.end(image));
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/tiny.qcow2`;
    const imageKey = `ci-contract-${tag}`;
    const provider = createKvmProvider({
      name: 'kvm-contract',
      config: {
        sshKeyFile: env.sshKeyFile,
        knownHostsFile: env.knownHostsFile,
        domainType: 'qemu',
        diskSizeGb: 1,
        installGuestAgent: false,
        images: {
          [imageKey]: { url, sha256: createHash('sha256').update(image).digest('hex'), firmware: 'bios' },
        },
        machineTypes: { small: { vcpus: 1, memoryMiB: 64 } },
        hosts: [
          {
            name: 'ci',
            address: `${env.sshHost}:${env.sshPort}`,
            user: env.sshUser,
            bridge: 'br-not-used-in-tests',
            pool: env.pool,
            socket: env.socketPath,
          },
        ],
      },
      interfaceXml: "<interface type='user'><model type='virtio'/></interface>",
      dialTimeoutMs: 10_000,
    });
    return {
      provider,
      uniqueName: (what) => ciName(env, what),
      request: (name, over) => createRequest(name, { cloudInit: '#cloud-config\n', ...over }),
      missingID: () => `hosts/ci/domains/${ciName(env, 'missing')}`,
      malformedID: 'hosts/ci/vms/x',
      close: () => new Promise<void>((r) => server.close(() => r())),
    };
  },
  { timeoutMs: 120_000 },
);
