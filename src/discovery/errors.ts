/**
 * discovery/errors — the API's error bodies and the mapping from a thrown error to a status:
 * field errors are 400s, Fastify's content-type and size refusals are 415/413, anything else
 * is a 500 whose detail goes to the log, never to the client.
 */
import type { FastifyError, FastifyInstance } from 'fastify';
import type { Logger } from 'pino';
import { LeaseInputError } from '../lease/store.ts';
import { FieldError } from './validation.ts';

export function errorBody(code: string, message: string, field?: string) {
  return { error: field === undefined ? { code, message } : { code, message, field } };
}

/** Installs the error and not-found handlers; `bodyLimit` is quoted in the 413 message. */
export function installErrorHandling(app: FastifyInstance, log: Logger, bodyLimit: number): void {
  app.setErrorHandler((err: FastifyError | FieldError | LeaseInputError, req, reply) => {
    if (err instanceof FieldError || err instanceof LeaseInputError) {
      return reply.code(400).send(errorBody('bad_request', err.message, err.field));
    }
    const code = (err as FastifyError).code;
    if (code === 'FST_ERR_CTP_INVALID_MEDIA_TYPE') {
      return reply
        .code(415)
        .send(errorBody('unsupported_media_type', 'content type must be application/json'));
    }
    if (code === 'FST_ERR_CTP_BODY_TOO_LARGE') {
      return reply.code(413).send(errorBody('payload_too_large', `body larger than ${bodyLimit} bytes`));
    }
    const status = (err as FastifyError).statusCode ?? 500;
    if (status >= 400 && status < 500) return reply.code(status).send(errorBody('bad_request', err.message));
    req.otel?.span.recordException({ name: err.name, message: err.message });
    log.error({ err }, 'discovery handler error');
    return reply.code(500).send(errorBody('internal', 'internal error'));
  });

  app.setNotFoundHandler((req, reply) => {
    reply.code(404).send(errorBody('not_found', `no route ${req.method} ${req.url.split('?')[0]}`));
  });
}
