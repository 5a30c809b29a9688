/**
 * provider/gcp/clients — builds the Compute Engine clients: loads the Google libraries on first
 * use, turns the configured endpoint into client options, and resolves credentials itself
 * (a credentials file by its declared type, else application default credentials).
 */
import { readFileSync } from 'node:fs';
import type { FirewallsClient, InstancesClient, ZoneOperationsClient } from '@google-cloud/compute';
import type { ClientOptions, googleAuthLibrary } from 'google-gax';
import type { Logger } from 'pino';
import { isHttpUrl } from '../../api/url.ts';
import { ProviderError, permanent, transient } from '../errors.ts';
import { raceSignal, toProviderError, type Where } from './errors.ts';
import { enableWireLog } from './wire.ts';

type AuthClient = googleAuthLibrary.AuthClient;
type ExternalAccountClientOptions = googleAuthLibrary.ExternalAccountClientOptions;

/**
 * The Google libraries, loaded on first use: importing them costs seconds (compute's protos),
 * which every operator start would pay even with no gcp provider configured.
 */
let gaxModule: Promise<typeof import('google-gax')> | undefined;
let computeModule: Promise<typeof import('@google-cloud/compute')> | undefined;
function loadGax() {
  gaxModule ??= import('google-gax');
  return gaxModule;
}
async function loadGoogle() {
  computeModule ??= import('@google-cloud/compute').then(
    (c) => (c as { default?: typeof import('@google-cloud/compute') }).default ?? c,
  );
  const [gax, compute] = await Promise.all([loadGax(), computeModule]);
  return { gax, compute };
}

const CLOUD_PLATFORM_SCOPE = 'https://www.googleapis.com/auth/cloud-platform';

/** Client options the provider passes on (tests: apiEndpoint, port, protocol, authClient). */
export type GcpClientOptions = Pick<
  ClientOptions,
  'apiEndpoint' | 'port' | 'protocol' | 'authClient' | 'fallback'
>;

export interface Clients {
  instances: InstancesClient;
  /** Built on first use: only a provider managing the firewall rule needs it. */
  firewalls(): FirewallsClient;
  /** Zone operations (wait, get): how inserts and deletes are followed to their end. */
  zoneOperations(): ZoneOperationsClient;
  close(): Promise<void>;
}

/** `apiEndpoint` of the config (host, host:port or URL) as client options. */
export function endpointOptions(apiEndpoint: string | undefined): GcpClientOptions {
  if (!apiEndpoint) return {};
  if (isHttpUrl(apiEndpoint)) {
    const u = new URL(apiEndpoint);
    const protocol = u.protocol.slice(0, -1);
    return {
      apiEndpoint: u.hostname,
      port: u.port ? Number(u.port) : protocol === 'http' ? 80 : 443,
      protocol,
    };
  }
  const m = /^(.*?)(?::(\d+))?$/.exec(apiEndpoint);
  return m?.[2] ? { apiEndpoint: m[1] ?? '', port: Number(m[2]) } : { apiEndpoint };
}

/**
 * The auth client of a credentials file, by its declared type, with the type-specific
 * constructor (the generic loader accepts any type, including ones that fetch arbitrary URLs).
 * Missing or unreadable: transient (a Secret mount may appear); anything else: permanent.
 */
export async function credentialsFromFile(file: string): Promise<AuthClient> {
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code ?? 'error';
    throw transient(`gcp.credentialsFile ${file} is not readable (${code})`);
  }
  let json: Record<string, unknown>;
  try {
    json = JSON.parse(text) as Record<string, unknown>;
  } catch {
    throw permanent(`gcp.credentialsFile ${file} is not JSON (want a service-account key file)`);
  }
  const { googleAuthLibrary: gal } = await loadGax();
  const str = (k: string) => (typeof json[k] === 'string' ? (json[k] as string) : undefined);
  const scopes = [CLOUD_PLATFORM_SCOPE];
  switch (json.type) {
    case 'service_account': {
      const email = str('client_email');
      const key = str('private_key');
      if (!email || !key) {
        throw permanent(
          `gcp.credentialsFile ${file}: a service_account key needs client_email and private_key`,
        );
      }
      const keyId = str('private_key_id');
      return new gal.JWT({ email, key, scopes, ...(keyId ? { keyId } : {}) });
    }
    case 'authorized_user': {
      const clientId = str('client_id');
      const clientSecret = str('client_secret');
      const refreshToken = str('refresh_token');
      if (!clientId || !clientSecret || !refreshToken) {
        throw permanent(
          `gcp.credentialsFile ${file}: authorized_user credentials need client_id, client_secret and refresh_token`,
        );
      }
      return new gal.UserRefreshClient({ clientId, clientSecret, refreshToken });
    }
    case 'external_account': {
      let client: AuthClient | null;
      try {
        client = gal.ExternalAccountClient.fromJSON({
          ...(json as unknown as ExternalAccountClientOptions),
          scopes,
        });
      } catch (err) {
        throw permanent(`gcp.credentialsFile ${file}: ${(err as Error).message}`);
      }
      if (!client) throw permanent(`gcp.credentialsFile ${file}: not a valid external_account configuration`);
      return client;
    }
    default:
      throw permanent(
        `gcp.credentialsFile ${file}: type ${JSON.stringify(json.type)} is not supported (want service_account, external_account or authorized_user)`,
      );
  }
}

export interface BuildClientsOptions {
  clientOptions: GcpClientOptions;
  credentialsFile: string | undefined;
  wireLog: boolean;
  log: Logger;
  /** Checked once the libraries and credentials are loaded: a closed provider builds nothing. */
  isClosed: () => boolean;
}

const partialWrapped = new WeakSet<AuthClient>();
const AGGREGATED_INSTANCES = /\/projects\/[^/]+\/aggregated\/instances$/;

/**
 * Adds `returnPartialSuccess=true` to every aggregated instance list: without it one zone whose
 * backend is down fails the whole list (the health check and every sweep), with it the other
 * zones answer and the down one comes back as an UNREACHABLE scope. The v1 request type of
 * @google-cloud/compute 7.8 has no such field and its REST transport drops unknown fields, so
 * the parameter goes on where every request of the provider's clients passes: its auth client.
 */
export function askPartialSuccess(auth: AuthClient): void {
  if (partialWrapped.has(auth)) return;
  partialWrapped.add(auth);
  const inner = auth.fetch.bind(auth);
  auth.fetch = ((input: unknown, init?: unknown) => {
    if (typeof input === 'string' || input instanceof URL) {
      const url = new URL(input.toString());
      if (AGGREGATED_INSTANCES.test(url.pathname) && !url.searchParams.has('returnPartialSuccess')) {
        url.searchParams.set('returnPartialSuccess', 'true');
        return (inner as (i: unknown, n?: unknown) => unknown)(
          typeof input === 'string' ? url.toString() : url,
          init,
        );
      }
    }
    return (inner as (i: unknown, n?: unknown) => unknown)(input, init);
  }) as AuthClient['fetch'];
}

/**
 * The compute clients. The auth client is resolved here rather than by google-gax: gax resolves
 * credentials lazily inside a promise nobody awaits, so a missing file or absent ADC would
 * surface as an unhandled rejection that kills the process.
 */
export async function buildClients(o: BuildClientsOptions): Promise<Clients> {
  const { compute, gax } = await loadGoogle();
  let authClient = o.clientOptions.authClient;
  if (!authClient) {
    const file = o.credentialsFile;
    try {
      authClient = file
        ? await credentialsFromFile(file)
        : await new gax.googleAuthLibrary.GoogleAuth({ scopes: [CLOUD_PLATFORM_SCOPE] }).getClient();
    } catch (err) {
      if (err instanceof ProviderError) throw err;
      const what = file ? `gcp.credentialsFile ${file}` : 'application default credentials';
      throw transient(`${what}: cannot load credentials: ${(err as Error).message}`);
    }
  }
  askPartialSuccess(authClient);
  if (o.wireLog) authClient = enableWireLog(authClient, o.log);
  const opts: ClientOptions = {
    fallback: true,
    // gax's own request logging would print request bodies (user-data): never on.
    enableTelemetryLogging: false,
    ...o.clientOptions,
    authClient,
  };
  if (o.isClosed()) throw transient('provider is closed');
  const instances = new compute.InstancesClient(opts);
  let firewalls: FirewallsClient | undefined;
  let zoneOperations: ZoneOperationsClient | undefined;
  return {
    instances,
    firewalls: () => {
      firewalls ??= new compute.FirewallsClient(opts);
      return firewalls;
    },
    zoneOperations: () => {
      zoneOperations ??= new compute.ZoneOperationsClient(opts);
      return zoneOperations;
    },
    close: async () => {
      await Promise.allSettled([instances.close(), firewalls?.close(), zoneOperations?.close()]);
    },
  };
}

/**
 * The clients of one provider, built on first use (a failed build is retried by the next
 * call); after close every call fails as Transient and nothing is built any more.
 */
export class LazyClients {
  private clients: Clients | undefined;
  private building: Promise<Clients> | undefined;
  private closed = false;
  private readonly opts: Omit<BuildClientsOptions, 'isClosed'>;

  constructor(opts: Omit<BuildClientsOptions, 'isClosed'>) {
    this.opts = opts;
  }

  async get(signal: AbortSignal, where: Where): Promise<Clients> {
    if (this.clients) return this.clients;
    const prefix = `${where.provider} ${where.op}`;
    const opts = {
      op: where.op,
      provider: where.provider,
      ...(where.providerID ? { providerID: where.providerID } : {}),
    };
    if (this.closed) throw transient(`${prefix}: provider is closed`, opts);
    if (!this.building) {
      const p = buildClients({ ...this.opts, isClosed: () => this.closed });
      this.building = p;
      p.then(
        (c) => {
          this.clients = c;
        },
        () => {
          this.building = undefined;
        },
      );
    }
    try {
      return await raceSignal(this.building, signal);
    } catch (err) {
      if (err instanceof ProviderError)
        throw new ProviderError(err.errorClass, `${prefix}: ${err.message}`, opts);
      throw toProviderError(err, where, signal);
    }
  }

  async close(): Promise<void> {
    this.closed = true;
    const c = this.clients ?? (await this.building?.catch(() => undefined));
    this.clients = undefined;
    if (c) await c.close();
  }
}
