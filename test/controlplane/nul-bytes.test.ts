import t from 'tap';
import { startCpHarness } from '../fixtures/controlplane-harness.ts';
import { freshPgDatabase } from '../fixtures/pg-database.ts';

// PostgreSQL refuses U+0000 in text, so a NUL in a path parameter, a query filter or a body
// string reached the store as a 500. Every operation of the OpenAPI document (every route family),
// and the broker routes, now answer 400 Problem naming the field, on PGlite and on PostgreSQL.
const pgDb = await freshPgDatabase('dvx_nul');
if (!pgDb && process.env.CI) t.fail('PostgreSQL is not reachable on 127.0.0.1:5432');
if (pgDb) t.teardown(() => pgDb.drop());
const stores: [string, string | undefined][] = [
  ['pglite', undefined],
  ...(pgDb ? [['postgres', pgDb.dsn] as [string, string]] : []),
];

for (const [store, dsn] of stores) {
  t.test(store, async (t) => {
    const h = await startCpHarness([{ clientId: 'root', org: 'org-a', human: true }], {
      seedAdmin: ['root'],
      ...(dsn ? { databaseDsn: dsn } : {}),
    });
    t.teardown(() => h.close());
    const call = (method: string, path: string, body?: unknown) => h.call('root', method, path, body);
    await call('POST', '/orgs', { id: 'org-a', name: 'A' });
    await call('POST', '/orgs/org-a/groups', { id: 'g1', name: 'G' });
    const reg = await call('POST', '/enclaves', { name: 'e', enclave_id: 'enc-1', owning_org: 'org-a' });
    await call('POST', '/orgs/org-a/agents', { uid: 'agent-1', name: 'one', enclave_id: 'enc-1' });
    const doc = (await call('GET', '/openapi.json')).body as { paths: Record<string, Record<string, unknown>> };
    const VALUES: Record<string, string> = {
      org: 'org-a',
      subject: 'someone',
      group: 'g1',
      id: 'agent-1',
      name: 'p',
      key: 'model_policy',
      grant: '1',
      agent: 'agent-1',
      uid: 'agent-1',
      flag: 'inspect:llm',
    };
    const refused = (r: { status: number; body: any }, what: string) => {
      t.equal(r.status, 400, what);
      t.match(
        r.body,
        { type: 'https://dvx.dev/problems/bad-request', detail: /must not contain a NUL character/ },
        what,
      );
    };

    let operations = 0;
    for (const [template, ops] of Object.entries(doc.paths)) {
      for (const method of Object.keys(ops).map((m) => m.toUpperCase())) {
        operations++;
        const path = template.replace(/^\/api\/v1/, '');
        const params = [...path.matchAll(/\{([A-Za-z_]+)\}/g)].map((m) => m[1]);
        const concrete = (nul?: string) =>
          path.replace(/\{([A-Za-z_]+)\}/g, (_m, p: string) =>
            p === nul ? `${VALUES[p] ?? 'x'}%00` : (VALUES[p] ?? 'x'),
          );
        const body = method === 'POST' || method === 'PUT' ? {} : undefined;
        for (const p of params) refused(await call(method, concrete(p), body), `${method} ${template}: NUL in {${p}}`);
        refused(await call(method, `${concrete()}?org=org-a%00`, body), `${method} ${template}: NUL in a query filter`);
        if (body)
          refused(
            await call(method, concrete(), { name: 'a\u0000b', nested: [{ value: 'x\u0000' }] }),
            `${method} ${template}: NUL in a body string`,
          );
      }
    }
    t.ok(operations > 50, `${operations} operations`);

    // Where the old code reached the store: a member's subject, a group id, a config value's key,
    // a governance scope, a policy value's string (JSON-encoded, so the NUL arrives escaped and is
    // stored escaped: that one is accepted).
    refused(await call('PUT', '/orgs/org-a/members/a%00b', {}), 'member subject');
    refused(await call('POST', '/orgs/org-a/groups', { id: 'g2', name: 'nul\u0000name' }), 'group name');
    refused(await call('PUT', '/policies/exec?scope=org&org=org%00', { enabled: true }), 'governance scope');
    refused(await call('POST', '/orgs/org-a/grants', { principal: 'user:\u0000', role: 'member' }), 'grant principal');
    refused(await call('POST', '/orgs/org-a/grants', { 'principal\u0000': 'user:x', role: 'member' }), 'a body key');
    const escaped = await call('PUT', '/config/llmproxy/content_inspection', {
      value: JSON.stringify({ patterns: [{ pattern: 'x', description: 'nul\u0000inside' }] }),
    });
    t.equal(escaped.status, 200, 'a NUL inside the JSON-encoded value is escaped text, stored and served');
    const broker = await h.rawAt(
      h.cp.port,
      'PUT',
      '/v1/broker/address',
      JSON.stringify({ broker_url: 'https://b.example/\u0000' }),
      { authorization: `Bearer ${reg.body.key.token}`, 'content-type': 'application/json' },
    );
    t.equal(broker.status, 400, 'the broker routes too');
    const snapshot = await h.rawAt(h.cp.port, 'GET', '/v1/broker/snapshot', undefined, {
      authorization: `Bearer ${reg.body.key.token}`,
    });
    t.equal(snapshot.status, 200);
    t.equal(
      JSON.parse(snapshot.text).orgs['org-a'].config.content_inspection.value.patterns[0].description,
      'nul\u0000inside',
    );
  });
}
