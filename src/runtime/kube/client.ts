/**
 * runtime/kube/client — builds the client-node API objects the Kubernetes backend and the Lease
 * elector use, all sharing ONE undici Agent (client-node otherwise opens a new connection per
 * request) and a per-request timeout; plus per-call options for cancellation and the patch
 * Content-Type, which client-node would otherwise default to JSON patch.
 */
import {
  CoordinationV1Api,
  CoreV1Api,
  CustomObjectsApi,
  createConfiguration,
  type KubeConfig,
  type Middleware,
  Observable,
  type ObservableMiddleware,
  PatchStrategy,
  type RequestContext,
  type ResponseContext,
  ServerConfiguration,
  Watch,
} from '@kubernetes/client-node';
import { Agent, type Dispatcher, ProxyAgent } from 'undici';

export interface KubeClientOptions {
  /** Upper bound for one API request (not for watches); default 30 s. */
  requestTimeoutMs?: number;
}

export interface KubeClients {
  readonly kubeConfig: KubeConfig;
  readonly customObjects: CustomObjectsApi;
  readonly core: CoreV1Api;
  readonly coordination: CoordinationV1Api;
  /** Streaming watches (these keep client-node's own per-watch connection: long-lived anyway). */
  readonly watch: Watch;
  /** The shared dispatcher every non-watch request goes through. */
  readonly dispatcher: Dispatcher;
  close(): Promise<void>;
}

/** Per-call options: `signal` cancels the request; `patch` sets the patch Content-Type. */
export interface CallOptions {
  signal?: AbortSignal;
  patch?: 'merge' | 'json';
}

interface TlsOptions {
  ca?: string | Buffer | Array<string | Buffer>;
  cert?: string | Buffer;
  key?: string | Buffer;
  rejectUnauthorized?: boolean;
  servername?: string;
}

/** Builds the API clients over one shared, keep-alive HTTP agent. */
export async function createKubeClients(kc: KubeConfig, opts: KubeClientOptions = {}): Promise<KubeClients> {
  const cluster = kc.getCurrentCluster();
  if (!cluster) throw new Error('kubeconfig: no current cluster (check current-context)');
  const tls: TlsOptions = {};
  await kc.applyToHTTPSOptions(tls as Parameters<KubeConfig['applyToHTTPSOptions']>[0]);
  const connect = {
    ...(tls.ca !== undefined && { ca: tls.ca }),
    ...(tls.cert !== undefined && { cert: tls.cert }),
    ...(tls.key !== undefined && { key: tls.key }),
    ...(tls.rejectUnauthorized !== undefined && { rejectUnauthorized: tls.rejectUnauthorized }),
    ...(tls.servername !== undefined && { servername: tls.servername }),
  };
  const dispatcher: Dispatcher = cluster.proxyUrl?.startsWith('http')
    ? new ProxyAgent({ uri: cluster.proxyUrl, requestTls: connect })
    : new Agent({ connect, keepAliveTimeout: 30_000 });
  const timeoutMs = opts.requestTimeoutMs ?? 30_000;
  // One combined middleware: client-node reverses the middleware array in place on calls
  // without options, so several static middlewares would flip order between calls.
  const pin: Middleware = {
    pre: async (ctx: RequestContext) => {
      ctx.setDispatcher(dispatcher);
      ctx.setSignal(AbortSignal.timeout(timeoutMs));
      return ctx;
    },
    post: async (rsp: ResponseContext) => rsp,
  };
  const config = createConfiguration({
    baseServer: new ServerConfiguration<Record<string, string>>(cluster.server, {}),
    authMethods: { default: kc },
    promiseMiddleware: [pin],
  });
  return {
    kubeConfig: kc,
    customObjects: new CustomObjectsApi(config),
    core: new CoreV1Api(config),
    coordination: new CoordinationV1Api(config),
    watch: new Watch(kc),
    dispatcher,
    close: () => dispatcher.close(),
  };
}

function observableMiddleware(pre: (ctx: RequestContext) => void): ObservableMiddleware {
  return {
    pre: (ctx) => {
      pre(ctx);
      return new Observable<RequestContext>(Promise.resolve(ctx));
    },
    post: (rsp) => new Observable<ResponseContext>(Promise.resolve(rsp)),
  };
}

/**
 * Options for one call: appended after the shared middleware, so the caller's signal joins the
 * request timeout and the patch Content-Type overrides the generated default.
 */
export function callOptions(opts: CallOptions = {}) {
  const middleware: ObservableMiddleware[] = [];
  const { signal, patch } = opts;
  if (signal) {
    middleware.push(
      observableMiddleware((ctx) => {
        const current = ctx.getSignal();
        ctx.setSignal(current ? AbortSignal.any([current, signal]) : signal);
      }),
    );
  }
  if (patch) {
    const type = patch === 'merge' ? PatchStrategy.MergePatch : PatchStrategy.JsonPatch;
    middleware.push(observableMiddleware((ctx) => ctx.setHeaderParam('Content-Type', type)));
  }
  if (middleware.length === 0) return undefined;
  return { middleware, middlewareMergeStrategy: 'append' as const };
}
