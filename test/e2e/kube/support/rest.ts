/**
 * test/e2e/kube/support/rest — plain JSON REST calls to an API server (the real one or the REST test
 * server), verifying the real server's self-signed certificate. The tier's tests use it where they
 * must see status codes, reasons and bodies exactly as a client receives them.
 */
import { readFileSync } from 'node:fs';
import { Agent, fetch as undiciFetch } from 'undici';

export interface RestReply {
  status: number;
  // biome-ignore lint/suspicious/noExplicitAny: JSON bodies of any kind, read by the tests.
  body: any;
}

export interface Rest {
  readonly server: string;
  call(
    method: string,
    path: string,
    body?: unknown,
    opts?: { contentType?: string; token?: string },
  ): Promise<RestReply>;
  close(): Promise<void>;
}

export function rest(server: string, token: string, caFile?: string): Rest {
  const dispatcher = new Agent({
    connect: caFile ? { ca: readFileSync(caFile) } : { rejectUnauthorized: false },
  });
  return {
    server,
    call: async (method, path, body, opts = {}) => {
      const res = await undiciFetch(`${server}${path}`, {
        method,
        dispatcher,
        headers: {
          authorization: `Bearer ${opts.token ?? token}`,
          accept: 'application/json',
          ...(body === undefined ? {} : { 'content-type': opts.contentType ?? 'application/json' }),
        },
        ...(body === undefined ? {} : { body: typeof body === 'string' ? body : JSON.stringify(body) }),
      });
      const text = await res.text();
      let parsed: unknown = text;
      try {
        parsed = text ? JSON.parse(text) : undefined;
      } catch {
        // not JSON (e.g. a plain-text error): kept as text
      }
      return { status: res.status, body: parsed };
    },
    close: () => dispatcher.close(),
  };
}
