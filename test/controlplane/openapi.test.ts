import t from 'tap';
import { mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startCpHarness } from '../fixtures/controlplane-harness.ts';

// The OpenAPI document is generated from the routes' own JSON schemas (spec: Versioning: a
// machine-readable description of the full surface): every registered operator route is in it, and
// every operation carries its parameters, its request body's schema and its responses' schemas.
const h = await startCpHarness([{ clientId: 'root', org: 'org-a', human: true }], {
  seedAdmin: ['root'],
  agentTokenIssuerUrl: 'https://controlplane.dvx.test',
  auditDsn: `pglite://${await mkdtemp(join(tmpdir(), 'dvx-openapi-audit-'))}`,
  auditWalDir: await mkdtemp(join(tmpdir(), 'dvx-openapi-wal-')),
});
t.teardown(() => h.close());

interface Op {
  parameters: { name: string; in: string; schema: unknown }[];
  requestBody?: { content: Record<string, { schema?: unknown }> };
  responses: Record<string, { content?: Record<string, { schema?: unknown }> }>;
  'x-required-capability': string | null;
}
const doc = (await h.call('root', 'GET', '/openapi.json')).body as {
  openapi: string;
  paths: Record<string, Record<string, Op>>;
  components: { schemas: Record<string, unknown> };
};

/** Method and path of every route the running control plane serves, from fastify's route tree. */
function registered(tree: string): string[] {
  const out: string[] = [];
  const stack: string[] = [];
  for (const line of tree.split('\n')) {
    const m = /^([│ ]*)[├└]── (\S+)(?: \(([^)]*)\))?/.exec(line);
    if (!m) continue;
    const depth = m[1].length / 4;
    stack.length = depth;
    stack.push(m[2]);
    const path = stack.join('');
    for (const method of m[3]?.split(', ') ?? []) if (method !== 'HEAD') out.push(`${method.toLowerCase()} ${path}`);
  }
  return out;
}

t.test('every registered operator route is an operation of the document', async (t) => {
  t.equal(doc.openapi, '3.2.0');
  const routes = registered(h.cp.app.printRoutes({ commonPrefix: false })).filter((r) => r.includes(' /api/v1/'));
  t.ok(routes.length > 50, `${routes.length} routes`);
  // Parameters compared by position: fastify's tree shares one node between `:uid` and `:agent`.
  const shape = (path: string) => path.replace(/(:[A-Za-z_]+\|?)+/g, '{}').replace(/\{[A-Za-z_]+\}/g, '{}');
  const documented = new Set(
    Object.entries(doc.paths).flatMap(([path, ops]) => Object.keys(ops).map((m) => `${m} ${shape(path)}`)),
  );
  for (const route of routes) {
    const [method, path] = route.split(' ');
    t.ok(documented.has(`${method} ${shape(path)}`), `${route} is documented`);
  }
});

// The writes that take no body (whatever is sent is ignored); every other write declares its body.
const BODILESS = new Set([
  'POST /api/v1/enclaves/{id}/broker-key',
  'POST /api/v1/orgs/{org}/agents/{agent}/operator-token',
  'POST /api/v1/orgs/{org}/members/{subject}/offboard',
  'PUT /api/v1/orgs/{org}/groups/{group}/members/{subject}',
  'PUT /api/v1/packs/{name}/installations',
]);

t.test('every operation has its schemas', async (t) => {
  const hasSchema = (content: Record<string, { schema?: unknown }> | undefined) =>
    Object.values(content ?? {}).some((c) => c.schema !== undefined);
  for (const [path, ops] of Object.entries(doc.paths)) {
    for (const [method, op] of Object.entries(ops)) {
      const name = `${method.toUpperCase()} ${path}`;
      const success = Object.entries(op.responses).filter(([status]) => /^2\d\d$/.test(status));
      t.ok(success.length > 0, `${name}: a success response`);
      for (const [status, r] of success)
        t.ok(status === '204' || hasSchema(r.content), `${name}: ${status} has a schema`);
      t.ok(hasSchema(op.responses.default?.content), `${name}: errors are Problems`);
      const inPath = [...path.matchAll(/\{([A-Za-z_]+)\}/g)].map((m) => m[1]);
      t.same(
        op.parameters
          .filter((p) => p.in === 'path')
          .map((p) => p.name)
          .sort(),
        inPath.sort(),
        `${name}: its path parameters`,
      );
      if (op.requestBody) t.ok(hasSchema(op.requestBody.content), `${name}: its request body's schema`);
      else if (['post', 'put'].includes(method))
        t.ok(BODILESS.has(name), `${name}: a request body schema (or it takes none)`);
      t.ok('x-required-capability' in op, `${name}: its capability`);
    }
  }
});

t.test("schemas carry the spec's names", async (t) => {
  for (const name of [
    'orgView',
    'createOrgReq',
    'groupView',
    'createGrantReq',
    'grantView',
    'roleView',
    'memberView',
    'whoamiView',
    'enclaveView',
    'agentView',
    'createAgentReq',
    'configValueReq',
    'configValueView',
    'policyWriteView',
    'serviceAccountView',
    'erasureResultView',
    'RecordPage',
    'Problem',
  ]) {
    t.ok(doc.components.schemas[name], `${name} is a component`);
  }
  t.same(doc.paths['/api/v1/orgs'].post.requestBody!.content['application/json'].schema, {
    $ref: '#/components/schemas/createOrgReq',
  });
  t.match(doc.components.schemas.grantView, {
    properties: { id: { type: 'integer' }, principal: { type: 'string' } },
    additionalProperties: false,
  });
});
