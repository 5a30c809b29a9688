/**
 * gateway/ca — the operator CA that HTTPS inspection signs its per-host certificates with
 * (docs/gateway.md, "HTTPS inspection"). Made once and kept where every gateway of the
 * installation finds the same one: a directory under the state dir (standalone, key mode 0600)
 * or one Secret (cluster, created by whichever replica comes first, read by all). Leaves share
 * one key pair per process and are cached per host, so a host seen before costs a Map lookup.
 * The key never leaves this module but as a `tls.SecureContext`: it is not logged, not served.
 */
import { createPrivateKey, X509Certificate } from 'node:crypto';
import { chmod, mkdir, readFile, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import tls from 'node:tls';
import { type SecretClient, StoreError } from '../runtime/store.ts';
import { issueLeaf, makeCaCertificate, newKeyPair, type Signer } from '../runtime/x509.ts';

export const CA_COMMON_NAME = 'egress-proxies-operator gateway CA';
/** The CA is made valid this long (ten years): replacing it means every client trusting it again. */
const CA_DAYS = 3650;
/** Leaves are valid a week and issued again after a day in the cache. */
const LEAF_DAYS = 7;
const LEAF_REISSUE_MS = 86_400_000;
/** Hosts whose leaves are kept; the least recently used one goes first. */
export const LEAF_CACHE_SIZE = 10_000;

/** The CA as stored: PEM certificate and PEM (PKCS#8) key. */
export interface CaMaterial {
  certPem: string;
  keyPem: string;
}

/** Where the CA is kept: loaded if present, otherwise `make` is stored unless someone stored one first. */
export interface CaStore {
  /** For logs: a path or an object name, never the key. */
  readonly where: string;
  loadOrCreate(make: () => CaMaterial): Promise<CaMaterial>;
}

function newCa(now: number): CaMaterial {
  const keys = newKeyPair();
  return {
    certPem: makeCaCertificate(CA_COMMON_NAME, keys, now, CA_DAYS),
    keyPem: keys.privateKey.export({ type: 'pkcs8', format: 'pem' }).toString(),
  };
}

/** Standalone: `<dir>/ca.key` (0600) and `<dir>/ca.pem` (dir 0700). */
export class FileCaStore implements CaStore {
  readonly where: string;
  private readonly dir: string;
  constructor(dir: string) {
    this.dir = dir;
    this.where = dir;
  }

  async loadOrCreate(make: () => CaMaterial): Promise<CaMaterial> {
    const keyFile = join(this.dir, 'ca.key');
    const certFile = join(this.dir, 'ca.pem');
    await mkdir(this.dir, { recursive: true, mode: 0o700 });
    try {
      const mode = (await stat(keyFile)).mode & 0o777;
      if ((mode & 0o077) !== 0) {
        // Someone loosened it: the key is the installation's trust, so it is tightened, not refused.
        await chmod(keyFile, 0o600);
      }
      return { keyPem: await readFile(keyFile, 'utf8'), certPem: await readFile(certFile, 'utf8') };
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
    }
    const m = make();
    await writeFile(certFile, m.certPem, { mode: 0o644 });
    // `wx`: a second process starting at the same moment keeps the first one's key.
    try {
      await writeFile(keyFile, m.keyPem, { mode: 0o600, flag: 'wx' });
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
      return this.loadOrCreate(make);
    }
    return m;
  }
}

/** The Secret's data keys. */
const SECRET_KEY = 'ca.key';
const SECRET_CERT = 'ca.pem';

/** Cluster: one Secret in the operator namespace, created if absent (the first replica's wins). */
export class SecretCaStore implements CaStore {
  readonly where: string;
  private readonly secrets: SecretClient;
  private readonly namespace: string;
  private readonly name: string;
  constructor(secrets: SecretClient, namespace: string, name: string) {
    this.secrets = secrets;
    this.namespace = namespace;
    this.name = name;
    this.where = `Secret ${namespace}/${name}`;
  }

  async loadOrCreate(make: () => CaMaterial): Promise<CaMaterial> {
    const key = { namespace: this.namespace, name: this.name };
    const fromSecret = (data: Record<string, string> | undefined): CaMaterial => {
      const k = data?.[SECRET_KEY];
      const c = data?.[SECRET_CERT];
      if (!k || !c)
        throw new Error(`${this.where} has no ${SECRET_KEY} and ${SECRET_CERT}; delete it to make a new CA`);
      return {
        keyPem: Buffer.from(k, 'base64').toString('utf8'),
        certPem: Buffer.from(c, 'base64').toString('utf8'),
      };
    };
    try {
      return fromSecret((await this.secrets.read(key)).data);
    } catch (err) {
      if (!(err instanceof StoreError && err.reason === 'NotFound')) throw err;
    }
    const m = make();
    try {
      await this.secrets.create({
        apiVersion: 'v1',
        kind: 'Secret',
        metadata: { ...key, labels: { 'app.kubernetes.io/component': 'gateway-ca' } },
        type: 'Opaque',
        data: {
          [SECRET_KEY]: Buffer.from(m.keyPem).toString('base64'),
          [SECRET_CERT]: Buffer.from(m.certPem).toString('base64'),
        },
      });
      return m;
    } catch (err) {
      if (!(err instanceof StoreError && err.reason === 'AlreadyExists')) throw err;
      return fromSecret((await this.secrets.read(key)).data);
    }
  }
}

interface Leaf {
  context: tls.SecureContext;
  issuedAt: number;
}

/** The loaded CA: its public certificate, and server contexts for hosts, issued on demand and cached. */
export class GatewayCa {
  /** The public certificate (PEM), served at `GET /v1/gateway/ca.pem`. */
  readonly certPem: string;
  private readonly signer: Signer;
  private readonly leafKeys = newKeyPair();
  private readonly leafKeyPem: string;
  private readonly leaves = new Map<string, Leaf>();
  private readonly now: () => number;
  private readonly max: number;

  constructor(material: CaMaterial, now: () => number, max = LEAF_CACHE_SIZE) {
    const cert = new X509Certificate(material.certPem);
    const key = createPrivateKey(material.keyPem);
    if (!cert.checkPrivateKey(key)) throw new Error('the gateway CA key does not belong to its certificate');
    this.certPem = material.certPem;
    this.signer = { cert, key };
    this.leafKeyPem = this.leafKeys.privateKey.export({ type: 'pkcs8', format: 'pem' }).toString();
    this.now = now;
    this.max = max;
  }

  /** Loads the CA from `store`, making it there first if absent. */
  static async open(store: CaStore, now: () => number): Promise<GatewayCa> {
    return new GatewayCa(await store.loadOrCreate(() => newCa(now())), now);
  }

  /** Leaves in the cache. */
  get cached(): number {
    return this.leaves.size;
  }

  /** A server context for `host` (a name, or an address literal without brackets). */
  contextFor(host: string): tls.SecureContext {
    const now = this.now();
    const hit = this.leaves.get(host);
    if (hit && now - hit.issuedAt < LEAF_REISSUE_MS) {
      // Map order is insertion order: re-inserting makes it the most recently used.
      this.leaves.delete(host);
      this.leaves.set(host, hit);
      return hit.context;
    }
    const cert = issueLeaf(this.signer, [host], this.leafKeys.publicKey, now, LEAF_DAYS);
    const context = tls.createSecureContext({
      cert: `${cert}${this.certPem}`,
      key: this.leafKeyPem,
      minVersion: 'TLSv1.2',
    });
    this.leaves.delete(host);
    this.leaves.set(host, { context, issuedAt: now });
    if (this.leaves.size > this.max) {
      const oldest = this.leaves.keys().next().value;
      if (oldest !== undefined) this.leaves.delete(oldest);
    }
    return context;
  }
}
