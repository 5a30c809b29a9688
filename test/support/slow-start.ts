/**
 * test/support/slow-start — makes new instances of any provider "slow to start serving", the
 * way a VM is Running with an address long before cloud-init has started Squid: while `slow`
 * is set, each instance created gets a loopback gate in front of it and the provider reports
 * the gate's port as the instance's. Until `open(name)` the gate accepts and drops every
 * connection; after it, it relays bytes to the real instance. Test-side only: the provider
 * underneath is unchanged.
 */
import net, { type AddressInfo } from 'node:net';
import type { CallContext, CreateRequest, Instance, Provider } from '../../src/provider/contract.ts';

interface Gate {
  server: net.Server;
  port: number;
  open: boolean;
  sockets: Set<net.Socket>;
}

export class SlowStart {
  /** New instances get a closed gate while this is true. */
  slow = false;
  private readonly gates = new Map<string, Gate>();
  private readonly inner: Provider;

  constructor(inner: Provider) {
    this.inner = inner;
  }

  /** The wrapped provider the reconciler uses. */
  provider(): Provider {
    return {
      name: this.inner.name,
      type: this.inner.type,
      create: (ctx, req) => this.create(ctx, req),
      get: async (ctx, id) => this.through(await this.inner.get(ctx, id)),
      delete: async (ctx, id) => {
        await this.inner.delete(ctx, id);
        const name = [...this.gates.keys()].find((n) => id.endsWith(`/${n}`));
        if (name) await this.closeGate(name);
      },
      listByTag: async (ctx) => (await this.inner.listByTag(ctx)).map((i) => this.through(i)),
    };
  }

  /** Names of instances behind a gate that is still closed. */
  closed(): string[] {
    return [...this.gates].filter(([, g]) => !g.open).map(([n]) => n);
  }

  /** The instance starts serving. */
  open(name: string): void {
    const g = this.gates.get(name);
    if (!g) throw new Error(`no gate for ${name}`);
    g.open = true;
  }

  async close(): Promise<void> {
    for (const name of [...this.gates.keys()]) await this.closeGate(name);
  }

  private async create(ctx: CallContext, req: CreateRequest): Promise<Instance> {
    const inst = await this.inner.create(ctx, req);
    if (this.slow && !this.gates.has(inst.name) && inst.address && inst.port) {
      this.gates.set(inst.name, await startGate(inst.address, inst.port));
    }
    return this.through(inst);
  }

  private through(inst: Instance): Instance {
    const g = this.gates.get(inst.name);
    return g ? { ...inst, address: '127.0.0.1', port: g.port } : inst;
  }

  private async closeGate(name: string): Promise<void> {
    const g = this.gates.get(name);
    if (!g) return;
    this.gates.delete(name);
    for (const s of g.sockets) s.destroy();
    await new Promise<void>((resolve) => g.server.close(() => resolve()));
  }
}

async function startGate(host: string, port: number): Promise<Gate> {
  const gate: Gate = { server: net.createServer(), port: 0, open: false, sockets: new Set() };
  gate.server.on('connection', (client) => {
    if (!gate.open) {
      client.destroy();
      return;
    }
    const upstream = net.connect(port, host);
    for (const s of [client, upstream]) {
      gate.sockets.add(s);
      s.on('close', () => gate.sockets.delete(s));
      s.on('error', () => {
        client.destroy();
        upstream.destroy();
      });
    }
    client.pipe(upstream);
    upstream.pipe(client);
  });
  await new Promise<void>((resolve) => gate.server.listen(0, '127.0.0.1', () => resolve()));
  gate.port = (gate.server.address() as AddressInfo).port;
  return gate;
}
