/**
 * discovery/openapi — builds the OpenAPI 3.1 document served at /openapi.json from the same
 * route table and schemas the server validates, serialises and types its handlers with, so the
 * document cannot drift.
 */
import type { TSchema } from 'typebox';
import { NAMED_SCHEMAS, type OperationId, ROUTES, type RouteDef } from './schemas.ts';

type Json = Record<string, unknown>;

const byObject = new Map<TSchema, string>(Object.entries(NAMED_SCHEMAS).map(([name, s]) => [s, name]));

/** A named schema becomes a $ref; anything else is inlined as plain JSON. */
function ref(schema: TSchema): Json {
  const name = byObject.get(schema);
  return name ? { $ref: `#/components/schemas/${name}` } : (JSON.parse(JSON.stringify(schema)) as Json);
}

function parameters(route: RouteDef): Json[] {
  const out: Json[] = [];
  for (const [where, schema] of [
    ['path', route.schema.params],
    ['query', route.schema.querystring],
  ] as const) {
    if (!schema) continue;
    const obj = schema as unknown as {
      properties: Record<string, TSchema & { description?: string }>;
      required?: string[];
    };
    for (const [name, prop] of Object.entries(obj.properties)) {
      const { description, ...rest } = JSON.parse(JSON.stringify(prop)) as Json & { description?: string };
      out.push({
        name,
        in: where,
        required: where === 'path' || (obj.required ?? []).includes(name),
        ...(description ? { description } : {}),
        schema: rest,
      });
    }
  }
  return out;
}

function operation(operationId: OperationId, route: RouteDef): Json {
  const responses: Json = {};
  for (const [status, description] of Object.entries(route.statuses)) {
    const schema = route.schema.response[Number(status)];
    if (schema) responses[status] = { description, content: { 'application/json': { schema: ref(schema) } } };
    else if (status === '200' && route.contentType)
      responses[status] = { description, content: { [route.contentType]: { schema: { type: 'string' } } } };
    else responses[status] = { description };
  }
  const op: Json = { operationId, summary: route.summary, responses };
  const params = parameters(route);
  if (params.length > 0) op.parameters = params;
  if (route.schema.body) {
    // A missing body is read as `{}`: optional only where `{}` is a valid body (a lease with every
    // default), required where the body has required fields (a report needs `result`).
    const needed = ((route.schema.body as { required?: string[] }).required ?? []).length > 0;
    op.requestBody = {
      required: needed,
      content: { 'application/json': { schema: ref(route.schema.body) } },
    };
  }
  op.security = route.auth ? [{ bearer: [] }] : [];
  return op;
}

export function buildOpenApi(version = '0.1.0'): Json {
  const paths: Record<string, Json> = {};
  for (const [operationId, route] of Object.entries(ROUTES) as [OperationId, RouteDef][]) {
    const path = route.url.replace(/:([A-Za-z]+)/g, '{$1}');
    paths[path] ??= {};
    paths[path][route.method.toLowerCase()] = operation(operationId, route);
  }
  const schemas: Json = {};
  for (const [name, schema] of Object.entries(NAMED_SCHEMAS))
    schemas[name] = JSON.parse(JSON.stringify(schema));
  return {
    openapi: '3.1.0',
    info: {
      title: 'egress-proxies-operator discovery API',
      version,
      description: 'Lease authenticated egress proxies with per-target cooldowns. See docs/lease-api.md.',
    },
    paths,
    components: {
      schemas,
      securitySchemes: {
        bearer: {
          type: 'http',
          scheme: 'bearer',
          description: 'The DISCOVERY_TOKEN configured on the operator.',
        },
      },
    },
    security: [{ bearer: [] }],
  };
}
