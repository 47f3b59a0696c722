import Fastify, { type FastifyInstance, type RouteOptions } from 'fastify';
import pkg from '../package.json' with { type: 'json' };

// GET /api/v1/openapi.json: an OpenAPI 3.2 document generated from the routes as they are registered
// (fastify's onRoute hook), each operation carrying `x-required-capability` from the route's config
// (null: a valid token is enough).

interface Operation {
  method: string;
  path: string;
  capability: string | null;
  /** Whose scope the capability is checked over when the path names no org: "caller-org" = the token's org. */
  target?: string;
  /** The agent-operator kind's one surface (its own audit trail). */
  agentOperator?: boolean;
  /** An SSE route (text/event-stream). */
  stream?: boolean;
}

export function collectOperations(app: FastifyInstance): Operation[] {
  const ops: Operation[] = [];
  app.addHook('onRoute', (route: RouteOptions) => {
    if (!route.url.startsWith('/api/v1/')) return;
    const methods = (Array.isArray(route.method) ? route.method : [route.method]).filter((m) => m !== 'HEAD');
    const config = route.config as { requiredCapability?: string | null; target?: string; agentOperator?: boolean; stream?: boolean } | undefined;
    const capability = config?.requiredCapability ?? null;
    for (const method of methods) {
      ops.push({
        method: method.toLowerCase(), path: route.url.replace(/:([A-Za-z_]+)/g, '{$1}'), capability,
        ...(config?.target ? { target: config.target } : {}), ...(config?.agentOperator ? { agentOperator: true } : {}), ...(config?.stream ? { stream: true } : {}),
      });
    }
  });
  return ops;
}

/** The operations `mount` registers under /api/v1, collected on an instance that never listens. */
export async function surfaceOperations(mount: (api: FastifyInstance) => Promise<void>): Promise<Operation[]> {
  const dry = Fastify({ logger: false });
  const ops = collectOperations(dry);
  await dry.register(async (api) => {
    api.get('/openapi.json', { config: { requiredCapability: null } }, async () => null);
    await mount(api);
  }, { prefix: '/api/v1' });
  await dry.ready();
  await dry.close();
  return ops;
}

export function openApiDocument(ops: readonly Operation[]): Record<string, unknown> {
  const paths: Record<string, Record<string, unknown>> = {};
  for (const op of ops) {
    const params = [...op.path.matchAll(/\{([A-Za-z_]+)\}/g)].map((m) => ({ name: m[1], in: 'path', required: true, schema: { type: 'string' } }));
    (paths[op.path] ??= {})[op.method] = {
      operationId: `${op.method}${op.path.replace(/[{}]/g, '').replace(/\/([a-z])/g, (_m, c: string) => c.toUpperCase()).replace(/[^A-Za-z0-9]/g, '')}`,
      parameters: params,
      security: [{ bearer: [] }],
      'x-required-capability': op.capability,
      ...(op.target ? { 'x-capability-target': op.target } : {}),
      ...(op.agentOperator ? { 'x-agent-operator': true } : {}),
      ...(op.stream ? { 'x-stream': true } : {}),
      responses: {
        default: { description: 'RFC 9457 problem', content: { 'application/problem+json': { schema: { $ref: '#/components/schemas/Problem' } } } },
      },
    };
  }
  return {
    openapi: '3.2.0',
    info: { title: 'dvx operator API', version: pkg.version },
    paths,
    components: {
      securitySchemes: { bearer: { type: 'http', scheme: 'bearer', bearerFormat: 'JWT' } },
      schemas: {
        Problem: {
          type: 'object',
          properties: { type: { type: 'string' }, title: { type: 'string' }, status: { type: 'integer' }, detail: { type: 'string' }, instance: { type: 'string' } },
        },
      },
    },
  };
}
