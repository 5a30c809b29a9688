/**
 * discovery/errors — the API's one error shape, `{error:{code,message,field?}}`, for every
 * refusal: field errors are 400s, Fastify's own refusals (content type or charset, size, bad URL,
 * an over-long path parameter, an oversized or timed-out request head) keep their status but get
 * the shape, anything else is a 500 whose detail goes to the log, never to the client. A message
 * never carries more than a short prefix of what the client sent.
 */
import type { Socket } from 'node:net';
import type {
  FastifyError,
  FastifyInstance,
  FastifyReply,
  FastifyRequest,
  FastifyServerOptions,
  preValidationHookHandler,
} from 'fastify';
import type { Logger } from 'pino';
import { LeaseInputError, TooManyLeasesError } from '../lease/errors.ts';
import { ROUTES } from './schemas.ts';
import { FieldError, MediaTypeError } from './validation.ts';

/** Longest path parameter (a lease ID, a session ID, a dashboard file); the schemas say the same. */
export const MAX_PARAM_LENGTH = 128;
/**
 * What the router itself lets through: it counts UTF-16 code units, the schemas count characters,
 * and a character outside the BMP is two units. Anything longer is surely over MAX_PARAM_LENGTH;
 * anything shorter reaches the schema, whose 400 names the field.
 */
export const ROUTER_MAX_PARAM_LENGTH = 2 * MAX_PARAM_LENGTH;
const MAX_MESSAGE = 300;
const MAX_FIELD = 100;

function clip(s: string, max: number): string {
  return s.length <= max ? s : `${s.slice(0, max - 1)}…`;
}

export function errorBody(code: string, message: string, field?: string) {
  const m = clip(message, MAX_MESSAGE);
  return {
    error: field === undefined ? { code, message: m } : { code, message: m, field: clip(field, MAX_FIELD) },
  };
}

function decoded(segment: string): string {
  try {
    return decodeURIComponent(segment);
  } catch {
    return segment;
  }
}

/**
 * The name of the path parameter that made `path` unroutable by its length (`id`, `file`): the
 * route whose fixed segments `path` has, at the parameter that is too long.
 */
export function overlongParam(path: string): string | undefined {
  const segments = path.split('/');
  for (const def of Object.values(ROUTES)) {
    const pattern = def.url.split('/');
    if (pattern.length !== segments.length) continue;
    let name: string | undefined;
    const fits = pattern.every((p, i) => {
      const seg = segments[i] ?? '';
      if (!p.startsWith(':')) return p === seg;
      if (decoded(seg).length > ROUTER_MAX_PARAM_LENGTH) name ??= p.slice(1);
      return true;
    });
    if (fits && name) return name;
  }
  return undefined;
}

/** Fastify answers these before any route or hook runs; they get the documented shape too. */
function frameworkError(err: FastifyError, req: FastifyRequest, reply: FastifyReply): void {
  if (err.code === 'FST_ERR_MAX_PARAM_LENGTH') {
    const name = overlongParam(req.url.split('?')[0] ?? '');
    const what = name ?? 'a path parameter';
    reply
      .code(400)
      .send(errorBody('bad_request', `${what} is longer than ${MAX_PARAM_LENGTH} characters`, name));
    return;
  }
  if (err.code === 'FST_ERR_BAD_URL') {
    reply.code(400).send(errorBody('bad_request', 'the URL path is not valid (malformed percent-encoding)'));
    return;
  }
  reply.code(err.statusCode ?? 400).send(errorBody('bad_request', 'malformed request'));
}

const CLIENT_ERRORS: Record<string, [number, string, string]> = {
  HPE_HEADER_OVERFLOW: [431, 'header_too_large', 'request headers are too large'],
  ERR_HTTP_REQUEST_TIMEOUT: [408, 'request_timeout', 'the request was not received in time'],
};

/**
 * A request Node refuses before Fastify sees it (headers too large, head or body too slow,
 * unparsable HTTP): answered in the shape on the raw socket, then closed.
 */
function clientError(err: NodeJS.ErrnoException, socket: Socket): void {
  if (err.code === 'ECONNRESET' || socket.destroyed) return;
  // Bytes after a response that said `Connection: close` (a body we answered without reading),
  // or an error while a response is already on the wire: a second response would corrupt it.
  const inFlight = (socket as Socket & { _httpMessage?: { headersSent?: boolean } })._httpMessage;
  if (err.code === 'HPE_CLOSED_CONNECTION' || inFlight?.headersSent) {
    socket.destroy();
    return;
  }
  const [status, code, message] = CLIENT_ERRORS[err.code ?? ''] ?? [
    400,
    'bad_request',
    'malformed HTTP request',
  ];
  const body = JSON.stringify(errorBody(code, message));
  if (socket.writable) {
    socket.write(
      `HTTP/1.1 ${status} ${code.replaceAll('_', ' ')}\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`,
    );
  }
  socket.destroy();
}

/** Fastify constructor options for the errors it handles itself. */
export function errorOptions(): Pick<FastifyServerOptions, 'frameworkErrors' | 'clientErrorHandler'> {
  return {
    frameworkErrors: frameworkError as FastifyServerOptions['frameworkErrors'],
    clientErrorHandler: clientError,
  };
}

/** An error answer: status, an optional Retry-After and the body. */
export interface Refusal {
  status: number;
  retryAfter?: string;
  body: ReturnType<typeof errorBody>;
}

/**
 * How the API answers `err` thrown while serving a request; undefined when it is not the
 * client's doing (a 500, detail to the log only). `bodyLimit` is quoted in the 413 message.
 */
export function refusalOf(err: unknown, bodyLimit: number): Refusal | undefined {
  if (err instanceof FieldError || err instanceof LeaseInputError) {
    return { status: 400, body: errorBody('bad_request', err.message, err.field) };
  }
  if (err instanceof MediaTypeError) {
    return { status: 415, body: errorBody('unsupported_media_type', err.message) };
  }
  if (err instanceof TooManyLeasesError) {
    return { status: 503, retryAfter: '1', body: errorBody('too_many_leases', err.message) };
  }
  const code = (err as FastifyError).code;
  if (code === 'FST_ERR_CTP_INVALID_MEDIA_TYPE') {
    return {
      status: 415,
      body: errorBody('unsupported_media_type', 'content type must be application/json'),
    };
  }
  if (code === 'FST_ERR_CTP_BODY_TOO_LARGE') {
    return { status: 413, body: errorBody('payload_too_large', `body larger than ${bodyLimit} bytes`) };
  }
  const status = (err as FastifyError).statusCode ?? 500;
  if (status >= 400 && status < 500)
    return { status, body: errorBody('bad_request', (err as Error).message) };
  return undefined;
}

export const INTERNAL_ERROR = errorBody('internal', 'internal error');

/**
 * Installs the error and not-found handlers; `bodyLimit` is quoted in the 413 message. An unknown
 * path is behind `guard` too, so without the token nobody learns which paths exist.
 */
export function installErrorHandling(
  app: FastifyInstance,
  log: Logger,
  bodyLimit: number,
  guard: preValidationHookHandler,
): void {
  app.setErrorHandler((err: FastifyError, req, reply) => {
    const refusal = refusalOf(err, bodyLimit);
    if (refusal) {
      if (refusal.retryAfter) reply.header('retry-after', refusal.retryAfter);
      return reply.code(refusal.status).send(refusal.body);
    }
    req.otel?.span.recordException({ name: err.name, message: err.message });
    log.error({ err }, 'discovery handler error');
    return reply.code(500).send(INTERNAL_ERROR);
  });

  app.setNotFoundHandler({ preValidation: guard }, (req, reply) => {
    const path = clip(req.url.split('?')[0] ?? '', 64);
    reply.code(404).send(errorBody('not_found', `no route ${req.method} ${path}`));
  });
}
