import Fastify, { type FastifyInstance, type FastifyServerOptions, type RouteOptions } from 'fastify';
import pkg from '../package.json' with { type: 'json' };
import { checkDeclaration } from './authz/capability-hook.ts';

// GET /api/v1/openapi.json: an OpenAPI 3.2 document generated from the routes as they are registered
// (fastify's onRoute hook): each operation's parameters, request body and responses are the JSON
// schemas fastify validates and serializes with, and it carries `x-required-capability` (null: a valid
// token is enough) and `x-capability-target` from the route's config (authz/capability-hook.ts). A
// schema titled with a spec name (orgView, createGrantReq, …) is a component, referenced by name.

type Schema = Record<string, unknown>;

interface RouteSchema {
  params?: Schema;
  querystring?: Schema;
  body?: Schema;
  response?: Record<string, Schema>;
  summary?: string;
}

export interface Operation {
  method: string;
  path: string;
  capability: string | null;
  /** Whose scope the capability is checked over (the target resolver's label), or how it is authorized. */
  target?: string;
  /** The agent-operator kind's one surface (its own audit trail). */
  agentOperator?: boolean;
  /** An SSE route (text/event-stream). */
  stream?: boolean;
  schema: RouteSchema;
}

export function collectOperations(app: FastifyInstance): Operation[] {
  const ops: Operation[] = [];
  app.addHook('onRoute', (route: RouteOptions) => {
    if (!route.url.startsWith('/api/v1/')) return;
    checkDeclaration(route);
    const methods = (Array.isArray(route.method) ? route.method : [route.method]).filter((m) => m !== 'HEAD');
    const config = route.config ?? {};
    const target = config.capabilityTarget?.label ?? config.targetLabel;
    for (const method of methods) {
      ops.push({
        method: method.toLowerCase(),
        path: route.url.replace(/:([A-Za-z_]+)/g, '{$1}'),
        capability: config.requiredCapability ?? null,
        ...(target ? { target } : {}),
        ...(config.agentOperator ? { agentOperator: true } : {}),
        ...(config.stream ? { stream: true } : {}),
        schema: (route.schema ?? {}) as RouteSchema,
      });
    }
  });
  return ops;
}

/** The operations `mount` registers under /api/v1, collected on an instance that never listens. */
export async function surfaceOperations(
  mount: (api: FastifyInstance) => Promise<void>,
  options: FastifyServerOptions,
): Promise<Operation[]> {
  const dry = Fastify({ ...options, logger: false });
  const ops = collectOperations(dry);
  await dry.register(
    async (api) => {
      api.get('/openapi.json', OPENAPI_ROUTE, async () => null);
      await mount(api);
    },
    { prefix: '/api/v1' },
  );
  await dry.ready();
  await dry.close();
  return ops;
}

/** The document route itself: any valid token reads it; its body is the open-ended document. */
export const OPENAPI_ROUTE = {
  config: { requiredCapability: null },
  schema: { response: { 200: { type: 'object', additionalProperties: true } } },
} as const;

const PROBLEM: Schema = {
  type: 'object',
  title: 'Problem',
  properties: {
    type: { type: 'string' },
    title: { type: 'string' },
    status: { type: 'integer' },
    detail: { type: 'string' },
    instance: { type: 'string' },
  },
};

/** Replaces every titled object schema by a reference to a component of that name. */
function hoist(schema: unknown, components: Record<string, Schema>): unknown {
  if (Array.isArray(schema)) return schema.map((s) => hoist(s, components));
  if (schema === null || typeof schema !== 'object') return schema;
  const out: Schema = {};
  for (const [k, v] of Object.entries(schema))
    out[k] =
      k === 'properties' || k === 'patternProperties' ? mapValues(v as Schema, components) : hoist(v, components);
  if (typeof out.title === 'string' && out.type === 'object') {
    components[out.title] ??= out;
    return { $ref: `#/components/schemas/${out.title}` };
  }
  return out;
}

function mapValues(props: Schema, components: Record<string, Schema>): Schema {
  return Object.fromEntries(Object.entries(props).map(([k, v]) => [k, hoist(v, components)]));
}

function parameters(where: 'path' | 'query', schema: Schema | undefined, components: Record<string, Schema>) {
  const props = (schema?.properties ?? {}) as Record<string, Schema>;
  const required = new Set((schema?.required ?? []) as string[]);
  return Object.entries(props).map(([name, s]) => ({
    name,
    in: where,
    required: where === 'path' || required.has(name),
    schema: hoist(s, components),
  }));
}

/** A body schema, or one keyed by media type (an optional body, schemas.ts `optionalBody`). */
function requestBody(body: Schema, components: Record<string, Schema>) {
  const content = body.content as Record<string, { schema: Schema }> | undefined;
  if (!content) return { required: true, content: { 'application/json': { schema: hoist(body, components) } } };
  return {
    required: false,
    content: Object.fromEntries(
      Object.entries(content).map(([type, c]) => [type, { schema: hoist(c.schema, components) }]),
    ),
  };
}

export function openApiDocument(ops: readonly Operation[]): Record<string, unknown> {
  const paths: Record<string, Record<string, unknown>> = {};
  const components: Record<string, Schema> = { Problem: PROBLEM };
  for (const op of ops) {
    const { schema } = op;
    const responses: Record<string, unknown> = {};
    for (const [status, s] of Object.entries(schema.response ?? {})) {
      const type = op.stream && status === '200' ? 'text/event-stream' : 'application/json';
      responses[status] =
        status === '204'
          ? { description: 'no content' }
          : { description: String(s.description ?? 'success'), content: { [type]: { schema: hoist(s, components) } } };
    }
    responses.default = {
      description: 'RFC 9457 problem',
      content: { 'application/problem+json': { schema: { $ref: '#/components/schemas/Problem' } } },
    };
    (paths[op.path] ??= {})[op.method] = {
      operationId: `${op.method}${op.path
        .replace(/[{}]/g, '')
        .replace(/\/([a-z])/g, (_m, c: string) => c.toUpperCase())
        .replace(/[^A-Za-z0-9]/g, '')}`,
      ...(schema.summary ? { summary: schema.summary } : {}),
      parameters: [
        ...parameters('path', schema.params, components),
        ...parameters('query', schema.querystring, components),
      ],
      ...(schema.body ? { requestBody: requestBody(schema.body, components) } : {}),
      security: [{ bearer: [] }],
      'x-required-capability': op.capability,
      ...(op.target ? { 'x-capability-target': op.target } : {}),
      ...(op.agentOperator ? { 'x-agent-operator': true } : {}),
      ...(op.stream ? { 'x-stream': true } : {}),
      responses,
    };
  }
  return {
    openapi: '3.2.0',
    info: { title: 'dvx operator API', version: pkg.version },
    paths,
    components: {
      securitySchemes: { bearer: { type: 'http', scheme: 'bearer', bearerFormat: 'JWT' } },
      schemas: components,
    },
  };
}
