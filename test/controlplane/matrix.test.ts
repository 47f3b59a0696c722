import t from 'tap';
import { startCpHarness } from '../fixtures/controlplane-harness.ts';
import { freshPgDatabase } from '../fixtures/pg-database.ts';

// The route × persona matrix, generated from the OpenAPI document the control plane serves: every
// operation refuses a caller without a token (401) and one without the capability it declares (403),
// and lets the platform administrator past both.
// On PGlite (the embedded default) and on PostgreSQL.
const pgDb = await freshPgDatabase('dvx_matrix');
if (!pgDb && process.env.CI) t.fail('PostgreSQL is not reachable on 127.0.0.1:5432');
const stores: [string, string | undefined][] = [['pglite', undefined], ...(pgDb ? [['postgres', pgDb.dsn] as [string, string]] : [])];
for (const [store, dsn] of stores) {
const h = await startCpHarness([{ clientId: 'root', org: 'org-a' }, { clientId: 'nobody', org: 'org-a' }], { seedAdmin: ['root'], ...(dsn ? { databaseDsn: dsn } : {}) });
t.teardown(() => h.close());
await h.call('root', 'POST', '/orgs', { id: 'org-a', name: 'A' });

const doc = (await h.call('root', 'GET', '/openapi.json')).body as { openapi: string; paths: Record<string, Record<string, { 'x-required-capability': string | null }>> };
const VALUES: Record<string, string> = { org: 'org-a', subject: 'someone-else', group: 'g1', id: '999', name: 'custom-x' };

t.test(`${store}: the document`, async (t) => {
  t.equal(doc.openapi, '3.2.0');
  t.ok(Object.keys(doc.paths).length >= 10, `${Object.keys(doc.paths).length} paths`);
  for (const [path, ops] of Object.entries(doc.paths)) {
    for (const [method, op] of Object.entries(ops)) t.ok('x-required-capability' in op, `${method} ${path} declares its capability`);
  }
  t.equal(doc.paths['/api/v1/whoami'].get['x-required-capability'], null);
  t.equal(doc.paths['/api/v1/orgs/{org}/grants'].post['x-required-capability'], 'members:*');
});

for (const [path, ops] of Object.entries(doc.paths)) {
  for (const [method, op] of Object.entries(ops)) {
    const concrete = path.replace(/\{([A-Za-z_]+)\}/g, (_m, p: string) => VALUES[p] ?? 'x').replace(/^\/api\/v1/, '');
    t.test(`${store}: ${method.toUpperCase()} ${path}`, async (t) => {
      const body = ['post', 'put'].includes(method) ? {} : undefined;
      const anonymous = await h.anonymous(method.toUpperCase(), concrete, body);
      t.equal(anonymous.status, 401, 'no token');
      t.equal(anonymous.body.type, 'https://dvx.dev/problems/unauthenticated');
      const nobody = await h.call('nobody', method.toUpperCase(), concrete, body);
      if (op['x-required-capability'] === null) t.not(nobody.status, 403, 'a valid token is enough');
      else t.equal(nobody.status, 403, `nobody is refused (${op['x-required-capability']})`);
      const root = await h.call('root', method.toUpperCase(), concrete, body);
      t.notOk([401, 403].includes(root.status), `the platform admin gets past authorization (${root.status})`);
    });
  }
}
}
if (pgDb) t.teardown(() => pgDb.drop());
