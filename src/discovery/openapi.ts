/**
 * discovery/openapi — builds the OpenAPI 3.1 document served at /openapi.json from the same
 * route table and schemas the server validates with, so the document cannot drift.
 */
import type { TSchema } from 'typebox';
import { NAMED_SCHEMAS, ROUTES, type RouteDef } from './schemas.ts';

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

function operation(route: RouteDef): Json {
  const responses: Json = {};
  for (const [status, description] of Object.entries(route.statuses)) {
    const schema = route.schema.response[Number(status)];
    responses[status] = schema
      ? { description, content: { 'application/json': { schema: ref(schema) } } }
      : { description };
  }
  const op: Json = { operationId: route.operationId, summary: route.summary, responses };
  const params = parameters(route);
  if (params.length > 0) op.parameters = params;
  if (route.schema.body) {
    op.requestBody = { required: false, content: { 'application/json': { schema: ref(route.schema.body) } } };
  }
  op.security = route.auth ? [{ bearer: [] }] : [];
  return op;
}

export function buildOpenApi(version = '0.1.0'): Json {
  const paths: Record<string, Json> = {};
  for (const route of ROUTES) {
    const path = route.url.replace(/:([A-Za-z]+)/g, '{$1}');
    paths[path] ??= {};
    paths[path][route.method.toLowerCase()] = operation(route);
  }
  paths['/openapi.json'] = {
    get: {
      operationId: 'openapi',
      summary: 'This document.',
      security: [{ bearer: [] }],
      responses: { 200: { description: 'OpenAPI 3.1 document.' } },
    },
  };
  const schemas: Json = {};
  for (const [name, schema] of Object.entries(NAMED_SCHEMAS))
    schemas[name] = JSON.parse(JSON.stringify(schema));
  return {
    openapi: '3.1.0',
    info: {
      title: 'egress-proxies-operator discovery API',
      version,
      description: 'Lease authenticated egress proxies with per-target cooldowns. See docs/api.md.',
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
