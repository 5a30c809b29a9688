/**
 * test/support/fake-provider — an in-memory Provider + Checker for every component's tests:
 * idempotent create by name, state transitions (Pending → Running with an address after N
 * gets, or on markRunning), lost instances, injectable failures and latency per operation,
 * call counters. Behaves like the contract says a real backend does, nothing more: the provider
 * contract suite (test/support/provider-contract.ts) runs the same cases against it and against
 * local, gcp and kvm, so a reconciler test passing on the fake means something.
 */
import type { TargetCheck } from '../../src/api/providerhealth.ts';
import { errorMessage } from '../../src/log/errors.ts';
import type {
  CallContext,
  Checker,
  CreateRequest,
  Instance,
  InstanceState,
  Provider,
} from '../../src/provider/contract.ts';
import { type ErrorClass, notFound, ProviderError, permanent, transient } from '../../src/provider/errors.ts';

/** The strictest name rule of the real backends (a GCE instance name, an RFC 1035 label). */
const NAME_PATTERN = /^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$/;
const ID_PREFIX = 'fake/';

export type FakeOp = 'create' | 'get' | 'delete' | 'listByTag' | 'adopt' | 'check';

/** A fault: a class (thrown `count` times, default forever), or a function deciding per call. */
export type FaultSpec =
  | { errorClass: ErrorClass; message?: string; count?: number }
  | ((call: FakeCall) => Error | undefined);

export interface FakeCall {
  op: FakeOp;
  /** create: the requested name; get/delete: the providerID. */
  target?: string;
  /** 1-based count of calls of this op so far, this one included. */
  n: number;
}

export interface FakeInstance extends Instance {
  /** Observations (gets, or creates of the existing name) answering Pending before Running. */
  pendingGets: number;
  request: CreateRequest;
}

export interface FakeProviderOptions {
  name?: string;
  type?: string;
  /**
   * Observations answered Pending before Running (a get, or a create of an existing name);
   * 0 = create returns Running already. Default 0.
   */
  pendingGets?: number;
  /** Address given to instance number i (1-based). Default 10.x.y.z from the counter. */
  address?: (i: number) => string;
  /** Per-op latency in ms (honours AbortSignal). */
  latency?: Partial<Record<FakeOp, number>>;
  /** Clock for createdAt. */
  now?: () => number;
}

export class FakeProvider implements Provider, Checker {
  readonly name: string;
  readonly type: string;
  readonly instances = new Map<string, FakeInstance>();
  readonly calls: Record<FakeOp, number> = {
    create: 0,
    get: 0,
    delete: 0,
    listByTag: 0,
    adopt: 0,
    check: 0,
  };
  /** Every call in order, for assertions on what the caller asked. */
  readonly log: FakeCall[] = [];
  /** Total instances ever created (a second create of one name does not count). */
  created = 0;
  pendingGets: number;
  latency: Partial<Record<FakeOp, number>>;
  checkResult: TargetCheck[] = [{ name: 'fake', ready: true, reason: 'Ready' }];
  private faults = new Map<FakeOp, FaultSpec>();
  private faultsAfter = new Map<FakeOp, FaultSpec>();
  private readonly address: (i: number) => string;
  private readonly now: () => number;

  constructor(opts: FakeProviderOptions = {}) {
    this.name = opts.name ?? 'fake';
    this.type = opts.type ?? 'fake';
    this.pendingGets = opts.pendingGets ?? 0;
    this.latency = { ...opts.latency };
    this.address = opts.address ?? ((i) => `10.${(i >> 16) & 255}.${(i >> 8) & 255}.${i & 255}`);
    this.now = opts.now ?? Date.now;
  }

  /** Make `op` fail: by class (optionally `count` times), or by a function of the call. */
  fail(op: FakeOp, fault: FaultSpec): this {
    this.faults.set(op, typeof fault === 'function' ? fault : { ...fault });
    return this;
  }

  /**
   * Make `op` fail AFTER it took effect — the backend did the work but the answer was lost
   * (a timeout, a crash of the caller): what crash-safety tests need.
   */
  failAfter(op: FakeOp, fault: FaultSpec): this {
    this.faultsAfter.set(op, typeof fault === 'function' ? fault : { ...fault });
    return this;
  }

  clearFaults(op?: FakeOp): this {
    if (op) {
      this.faults.delete(op);
      this.faultsAfter.delete(op);
    } else {
      this.faults.clear();
      this.faultsAfter.clear();
    }
    return this;
  }

  markRunning(id: string): void {
    const inst = this.mustHave(id);
    inst.pendingGets = 0;
    this.settle(inst);
  }

  setState(id: string, state: InstanceState, address?: string): void {
    const inst = this.mustHave(id);
    inst.state = state;
    inst.pendingGets = 0;
    if (address !== undefined) inst.address = address;
    if (state !== 'Running') delete inst.address;
  }

  /** The backend lost the instance behind our back (deleted out of band). */
  loseInstance(id: string): void {
    this.mustHave(id);
    this.instances.delete(id);
  }

  idOf(name: string): string {
    return `${ID_PREFIX}${name}`;
  }

  byName(name: string): FakeInstance | undefined {
    return this.instances.get(this.idOf(name));
  }

  /** Instances labelled with this Proxy UID. */
  instancesOf(uid: string): FakeInstance[] {
    return [...this.instances.values()].filter((i) => i.uid === uid);
  }

  async create(ctx: CallContext, req: CreateRequest): Promise<Instance> {
    await this.enter(ctx, 'create', req.name);
    if (!NAME_PATTERN.test(req.name)) {
      throw permanent(`${this.name} create: invalid instance name ${JSON.stringify(req.name)}`, {
        op: 'create',
        provider: this.name,
      });
    }
    const id = this.idOf(req.name);
    let inst = this.instances.get(id);
    if (!inst) {
      this.created++;
      inst = {
        id,
        name: req.name,
        state: 'Pending',
        uid: req.uid,
        namespace: req.namespace,
        ...(req.installation ? { installation: req.installation } : {}),
        createdAt: new Date(this.now()),
        port: req.port,
        pendingGets: this.pendingGets,
        request: { ...req },
        // Like a cloud placing the instance where placement.zone says.
        ...(req.zone ? { location: { zone: req.zone } } : {}),
      };
      this.settle(inst);
      this.instances.set(id, inst);
    } else {
      // Like every backend: a name another Proxy owns is Permanent, never handed over.
      if (inst.uid !== req.uid) {
        throw permanent(
          `${this.name} create ${id}: an instance of that name exists and does not belong to this Proxy`,
          {
            op: 'create',
            provider: this.name,
            providerID: id,
          },
        );
      }
      // Re-creating an existing name is the idempotent path: it observes the instance like a get.
      return this.observe(inst, () => this.after('create', req.name));
    }
    this.after('create', req.name);
    return snapshot(inst);
  }

  async get(ctx: CallContext, providerID: string): Promise<Instance> {
    await this.enter(ctx, 'get', providerID);
    this.parseID('get', providerID);
    const inst = this.instances.get(providerID);
    if (!inst) throw notFound(`${this.name} get ${providerID}: instance not found`);
    return this.observe(inst);
  }

  /** One look at a Pending instance counts down towards Running. */
  private observe(inst: FakeInstance, after?: () => void): Instance {
    const out = snapshot(inst);
    if (inst.state === 'Pending' && inst.pendingGets > 0) {
      inst.pendingGets--;
      this.settle(inst);
    }
    after?.();
    return out;
  }

  async delete(ctx: CallContext, providerID: string): Promise<void> {
    await this.enter(ctx, 'delete', providerID);
    this.parseID('delete', providerID);
    this.instances.delete(providerID);
    this.after('delete', providerID);
  }

  async listByTag(ctx: CallContext): Promise<Instance[]> {
    await this.enter(ctx, 'listByTag');
    return [...this.instances.values()].map(snapshot);
  }

  /** Like the kubernetes provider: adds the installation label to an instance without one. */
  async adopt(ctx: CallContext, providerID: string, installation: string): Promise<void> {
    await this.enter(ctx, 'adopt', providerID);
    this.parseID('adopt', providerID);
    const inst = this.instances.get(providerID);
    if (!inst) throw notFound(`${this.name} adopt ${providerID}: instance not found`);
    inst.installation = installation;
  }

  async check(ctx: CallContext): Promise<TargetCheck[]> {
    await this.enter(ctx, 'check').catch(() => undefined);
    return this.checkResult.map((t) => ({ ...t }));
  }

  /** Like every real backend: an ID that can never be valid is Permanent, not NotFound. */
  private parseID(op: FakeOp, id: string): void {
    const name = id.startsWith(ID_PREFIX) ? id.slice(ID_PREFIX.length) : '';
    if (!NAME_PATTERN.test(name)) {
      throw permanent(`${this.name} ${op}: malformed providerID ${JSON.stringify(id)}, want fake/<name>`, {
        op,
        provider: this.name,
        providerID: id,
      });
    }
  }

  private settle(inst: FakeInstance): void {
    if (inst.state === 'Pending' && inst.pendingGets <= 0) {
      inst.state = 'Running';
      inst.address = this.address(this.created);
    }
  }

  private mustHave(id: string): FakeInstance {
    const inst = this.instances.get(id);
    if (!inst) throw new Error(`FakeProvider: no instance ${id}`);
    return inst;
  }

  private async enter(ctx: CallContext, op: FakeOp, target?: string): Promise<void> {
    this.calls[op]++;
    const call: FakeCall = { op, n: this.calls[op], ...(target === undefined ? {} : { target }) };
    this.log.push(call);
    // Real providers answer an aborted call with a Transient ProviderError, never the raw reason.
    const aborted = (reason: unknown) =>
      transient(
        `${this.name} ${op}${target === undefined ? '' : ` ${target}`}: aborted: ${errorMessage(reason)}`,
        {
          op,
          provider: this.name,
          cause: reason,
        },
      );
    if (ctx.signal.aborted) throw aborted(ctx.signal.reason);
    const ms = this.latency[op];
    if (ms) await abortableDelay(ms, ctx.signal).catch((reason: unknown) => Promise.reject(aborted(reason)));
    this.inject(this.faults.get(op), call);
  }

  private after(op: FakeOp, target: string): void {
    const fault = this.faultsAfter.get(op);
    if (fault) this.inject(fault, { op, target, n: this.calls[op] });
  }

  private inject(fault: FaultSpec | undefined, call: FakeCall): void {
    if (!fault) return;
    if (typeof fault === 'function') {
      const err = fault(call);
      if (err) throw err;
      return;
    }
    if (fault.count !== undefined) {
      if (fault.count <= 0) return;
      fault.count--;
    }
    throw new ProviderError(
      fault.errorClass,
      fault.message ?? `${this.name} ${call.op}: injected ${fault.errorClass}`,
      { op: call.op, provider: this.name, ...(call.target === undefined ? {} : { providerID: call.target }) },
    );
  }
}

function snapshot(inst: FakeInstance): Instance {
  const out: Instance = { id: inst.id, name: inst.name, state: inst.state };
  if (inst.address !== undefined) out.address = inst.address;
  if (inst.port !== undefined) out.port = inst.port;
  if (inst.uid !== undefined) out.uid = inst.uid;
  if (inst.location !== undefined) out.location = { ...inst.location };
  if (inst.namespace !== undefined) out.namespace = inst.namespace;
  if (inst.installation !== undefined) out.installation = inst.installation;
  if (inst.createdAt !== undefined) out.createdAt = new Date(inst.createdAt);
  return out;
}

function abortableDelay(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    const t = setTimeout(() => {
      signal.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(t);
      reject(signal.reason);
    };
    signal.addEventListener('abort', onAbort, { once: true });
  });
}
