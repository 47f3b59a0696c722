import t from 'tap';
import fc from 'fast-check';
import pg from 'pg';
import { openDb } from '../../core/sql.ts';
import { migrate } from '../../controlplane/store/migrate.ts';
import { validateSnapshot } from '../../pipeline/policy/snapshot.ts';
import { validateGovernance, type GovernanceKind } from '../../pipeline/policy/governance.ts';
import { startCpHarness } from '../fixtures/controlplane-harness.ts';
import { freshPgDatabase } from '../fixtures/pg-database.ts';

// Every value the authoring routes accept builds a snapshot the proxy's own loader accepts. On
// the old code, content_inspection without pii_detection.types was stored as `"types": null` and from
// then on GET /v1/broker/snapshot and the effective-policy read answered 500 for every enclave
// carrying that scope.
const h = await startCpHarness([{ clientId: 'root', org: 'org-a', human: true }], { seedAdmin: ['root'] });
t.teardown(() => h.close());
const call = (method: string, path: string, body?: unknown) => h.call('root', method, path, body);
await call('POST', '/orgs', { id: 'org-a', name: 'A' });
await call('POST', '/orgs/org-a/groups', { id: 'g-1', name: 'G' });
const reg = await call('POST', '/enclaves', { name: 'e', enclave_id: 'enc-1', owning_org: 'org-a' });
await call('POST', '/orgs/org-a/agents', { uid: 'bot-1', name: 'b', enclave_id: 'enc-1', group: 'g-1' });
const brokerKey: string = reg.body.key.token;

async function snapshot() {
  const res = await h.rawAt(h.cp.port, 'GET', '/v1/broker/snapshot', undefined, {
    authorization: `Bearer ${brokerKey}`,
  });
  return { status: res.status, body: res.status === 200 ? JSON.parse(res.text) : res.text };
}
const enc = (v: unknown) => ({ value: JSON.stringify(v) });

t.test('the docs/snapshot.md example is stored as sent and distributed', async (t) => {
  const example = { secrets_filter: { enabled: true }, pii_detection: { enabled: true } };
  t.equal((await call('PUT', '/config/llmproxy/content_inspection', enc(example))).status, 200);
  const stored = (await call('GET', '/config/llmproxy')).body.find(
    (r: { key: string }) => r.key === 'content_inspection',
  );
  t.notOk('types' in JSON.parse(stored.value).pii_detection, 'an omitted types stays omitted (never "types": null)');
  const pack = await call('POST', '/packs', {
    name: 'hipaa',
    config: { content_inspection: { pii_detection: { enabled: true } } },
  });
  t.equal(pack.status, 201);
  t.equal((await call('PUT', '/packs/hipaa/installations?scope=org&org=org-a')).status, 200);

  const s = await snapshot();
  t.equal(s.status, 200, 'the snapshot is served');
  const loaded = validateSnapshot(s.body);
  t.same(
    loaded.orgs['org-a'].config.content_inspection!.value,
    {
      immutable: false,
      secrets_filter: { enabled: true, severity: 'block' },
      pii_detection: { enabled: true, severity: 'warn', types: null },
      api_key_detection: { enabled: false, severity: 'warn' },
      patterns: [],
    },
    'the proxy loads it: every PII type',
  );
  t.same(s.body.skipped, [], 'nothing skipped');
  const effective = await call('GET', '/agents/bot-1/effective-policy');
  t.equal(effective.status, 200);
  t.equal(effective.body.policy.content.pii_detection.enabled, true);
  t.same(effective.body.skipped, []);
  t.equal((await call('DELETE', '/packs/hipaa/installations?scope=org&org=org-a')).status, 200);
});

// Arbitraries covering every field of the three policy keys, the settings and the governance kinds,
// valid most of the time and sometimes not (a refused value is fine: only accepted ones must load).
const text = fc.oneof(
  { weight: 4, arbitrary: fc.string({ maxLength: 10 }) },
  { weight: 1, arbitrary: fc.string({ unit: 'binary', maxLength: 6 }) },
  { weight: 1, arbitrary: fc.constant('nul\u0000byte') },
);
const severity = fc.oneof(
  { weight: 9, arbitrary: fc.constantFrom('log', 'warn', 'block', 'redact') },
  { weight: 1, arbitrary: fc.constant('loud') },
);
const opt = { requiredKeys: [] as never[] };
const toggle = fc.record({ enabled: fc.boolean(), severity }, opt);
const glob = fc.constantFrom('claude-*', 'gpt-?', '*', 'o1', '[a-z]*', '[');
const contentInspection = fc.record(
  {
    immutable: fc.boolean(),
    secrets_filter: toggle,
    pii_detection: fc.record(
      {
        enabled: fc.boolean(),
        severity,
        types: fc.array(fc.constantFrom('email', 'credit_card', 'ssn'), { maxLength: 4 }),
      },
      opt,
    ),
    api_key_detection: toggle,
    patterns: fc.array(
      fc.record(
        { pattern: fc.constantFrom('foo[0-9]+', 'a|b', '(?i)secret', '(', ''), description: text, severity },
        { requiredKeys: ['pattern'] },
      ),
      { maxLength: 3 },
    ),
  },
  opt,
);
const modelPolicy = fc.record(
  {
    immutable: fc.boolean(),
    mode: fc.constantFrom('allowlist', 'blocklist', 'maybe'),
    models: fc.array(glob, { maxLength: 3 }),
  },
  { requiredKeys: ['mode'] },
);
const sidecar = fc.record(
  {
    name: fc.oneof(fc.constantFrom('a', 'b'), text),
    url: fc.constantFrom('http://127.0.0.1:9/inspect', 'https://sidecar.example/x', 'ftp://x', 'not a url'),
    timeout_ms: fc.integer({ min: -1, max: 700_000 }),
    on_request: fc.boolean(),
    on_response: fc.boolean(),
    async: fc.boolean(),
    severity,
    include_context: fc.boolean(),
  },
  { requiredKeys: ['name', 'url'] },
);
const sidecarInspection = fc.record({ immutable: fc.boolean(), sidecars: fc.array(sidecar, { maxLength: 2 }) }, opt);
const url = fc.constantFrom(
  'https://api.anthropic.com',
  'https://llm.internal/',
  'http://127.0.0.1:8080/v1',
  'file:///etc/passwd',
);
const settings = {
  model_policy: modelPolicy,
  content_inspection: contentInspection,
  sidecar_inspection: sidecarInspection,
  credential_mode: fc.constantFrom('platform', 'passthrough', 'mine'),
  downstream_url: url,
  upstream: fc.dictionary(fc.constantFrom('anthropic-messages', 'openai-chat', 'openai-responses', 'grpc'), url, {
    maxKeys: 2,
  }),
};
const setting = fc.oneof(
  ...Object.entries(settings).map(([key, value]) =>
    fc.record({ key: fc.constant(key), value: value as fc.Arbitrary<unknown> }),
  ),
);

const rule = fc.record(
  {
    cidr: fc.constantFrom('10.0.0.0/8', '::1', '192.168.1.1/33', '300.1.1.1'),
    host: fc.constantFrom('*.example.com', 'API.Example.com', 'bad host'),
    port: fc.integer({ min: -1, max: 70_000 }),
    reason: text,
  },
  opt,
);
const allowDeny = fc.record({ allow: fc.array(glob, { maxLength: 2 }), deny: fc.array(glob, { maxLength: 2 }) }, opt);
const governance: Record<string, fc.Arbitrary<Record<string, unknown>>> = {
  exec: fc.record({ enabled: fc.boolean(), locked: fc.boolean() }, { requiredKeys: ['enabled'] }),
  ssh: fc.record({ enabled: fc.boolean() }, opt),
  tunnel: fc.record({ enabled: fc.boolean(), locked: fc.boolean() }, { requiredKeys: ['enabled'] }),
  'tunnel-ports': fc.record(
    { ports: fc.array(fc.integer({ min: 0, max: 70_000 }), { maxLength: 4 }), locked: fc.boolean() },
    { requiredKeys: ['ports'] },
  ),
  destination: fc.record(
    { allow: fc.array(rule, { maxLength: 2 }), deny: fc.array(rule, { maxLength: 2 }), locked: fc.boolean() },
    opt,
  ),
  llm: fc.record(
    {
      credential_mode: fc.constantFrom('platform', 'passthrough', null, 'x'),
      models: allowDeny,
      providers: allowDeny,
      upstream: fc.dictionary(fc.constantFrom('anthropic', 'openai'), url, { maxKeys: 2 }),
      inspection: fc.record({
        inspectors: fc.array(
          fc.record(
            {
              name: text,
              rules: fc.array(
                fc.record(
                  {
                    tool: text,
                    verdict: fc.constantFrom('allow', 'deny', 'require_approval', 'maybe'),
                    summary: text,
                    model_match: glob,
                    arg_gt: fc.dictionary(
                      fc.constantFrom('n', 'size'),
                      fc.double({ noNaN: true, noDefaultInfinity: true }),
                      { maxKeys: 2 },
                    ),
                  },
                  opt,
                ),
                { maxLength: 2 },
              ),
            },
            opt,
          ),
          { maxLength: 2 },
        ),
      }),
      locked: fc.boolean(),
    },
    opt,
  ),
};
const kindOf: Record<string, GovernanceKind> = {
  exec: 'exec',
  ssh: 'ssh',
  tunnel: 'tunnel',
  'tunnel-ports': 'tunnel_ports',
  destination: 'destination',
  llm: 'llm',
};
const scope = fc.constantFrom(
  'scope=platform',
  'scope=org&org=org-a',
  'scope=group&org=org-a&group=g-1',
  'scope=agent&agent=bot-1',
);

const write = fc.oneof(
  fc.record({ to: fc.constant('platform' as const), setting, locked: fc.boolean() }),
  fc.record({ to: fc.constant('org' as const), setting, locked: fc.boolean() }),
  fc.record({ to: fc.constant('agent' as const), setting }),
  fc.record({
    to: fc.constant('pack' as const),
    name: fc.constantFrom('p-1', 'p-2'),
    config: fc.record(
      { model_policy: modelPolicy, content_inspection: contentInspection, sidecar_inspection: sidecarInspection },
      opt,
    ),
    at: fc.constantFrom('platform', 'org'),
  }),
  ...Object.entries(governance).map(([kind, body]) =>
    fc.record({ to: fc.constant('governance' as const), kind: fc.constant(kind), body, scope }),
  ),
);

t.test('property: every value the authoring routes accept builds a snapshot the proxy accepts', async (t) => {
  let accepted = 0;
  await fc.assert(
    fc.asyncProperty(fc.array(write, { minLength: 1, maxLength: 5 }), async (writes) => {
      for (const w of writes) {
        let res;
        if (w.to === 'platform' || w.to === 'org') {
          res = await call('PUT', `/${w.to === 'platform' ? 'platform/' : ''}config/llmproxy/${w.setting.key}`, {
            ...enc(w.setting.value),
            locked: w.locked,
          });
          if (res.status === 409) continue; // a lock above: refused, nothing stored
        } else if (w.to === 'agent') {
          res = await call('POST', '/agents/bot-1/config', {
            override_service: 'llmproxy',
            key: w.setting.key,
            value: JSON.stringify(w.setting.value),
          });
          if (res.status === 409) continue;
        } else if (w.to === 'pack') {
          res = await call('POST', '/packs', { name: w.name, config: w.config });
          if (res.status < 300)
            res = await call(
              'PUT',
              `/packs/${w.name}/installations?${w.at === 'org' ? 'scope=org&org=org-a' : 'scope=platform'}`,
            );
        } else {
          res = await call('PUT', `/policies/${w.kind}?${w.scope}`, w.body);
          if (res.status === 409) continue;
          if (res.status === 200) {
            // What was stored validates back to what was accepted.
            const stored = await call('GET', `/policies/${w.kind}?${w.scope}`);
            t.equal(stored.status, 200);
            const again = validateGovernance(kindOf[w.kind], { ...stored.body.value, locked: stored.body.locked });
            t.same(again, validateGovernance(kindOf[w.kind], w.body), `${w.kind} round-trips`);
          }
        }
        t.ok(
          res.status === 200 || res.status === 201 || res.status === 400,
          `${JSON.stringify(w)} → ${res.status} ${JSON.stringify(res.body)}`,
        );
        if (res.status !== 400) accepted++;
      }
      const s = await snapshot();
      if (s.status !== 200) throw new Error(`snapshot answered ${s.status}: ${s.body} after ${JSON.stringify(writes)}`);
      validateSnapshot(s.body);
      if (s.body.skipped.length > 0) throw new Error(`accepted rows were skipped: ${JSON.stringify(s.body.skipped)}`);
      const effective = await call('GET', '/agents/bot-1/effective-policy');
      if (effective.status !== 200) throw new Error(`effective-policy answered ${effective.status}`);
      const gov = await call('GET', '/agents/bot-1/effective-governance');
      if (gov.status !== 200) throw new Error(`effective-governance answered ${gov.status}`);
    }),
    { numRuns: 60, seed: Number(process.env.DVX_PROPERTY_SEED ?? Date.now() % 100000) },
  );
  t.ok(accepted > 20, `${accepted} accepted writes, each distributed`);
});

t.test(
  'a stored row that does not validate is skipped, logged, counted and named; never a 500 for everyone (PostgreSQL)',
  async (t) => {
    const pgdb = await freshPgDatabase('dvx_p72');
    if (!pgdb) {
      if (process.env.CI) t.fail('no PostgreSQL at 127.0.0.1:5432');
      return;
    }
    t.teardown(() => pgdb.drop());
    const cp = await h.start({ databaseDsn: pgdb.dsn, seedAdmin: ['root'] });
    t.teardown(() => cp.close());
    const at = (method: string, path: string, body?: unknown) => h.callAt(cp.port, 'root', method, path, body);
    await at('POST', '/orgs', { id: 'org-a', name: 'A' });
    const key = (await at('POST', '/enclaves', { name: 'e', enclave_id: 'enc-1', owning_org: 'org-a' })).body.key.token;
    await at('POST', '/orgs/org-a/agents', { uid: 'bot-1', name: 'b', enclave_id: 'enc-1' });
    t.equal((await at('PUT', '/config/llmproxy/downstream_url', enc('https://llm.internal'))).status, 200);
    const db = new pg.Client({ connectionString: pgdb.dsn });
    await db.connect();
    t.teardown(() => db.end());
    // A row no release of the authoring routes writes (by hand, or an older writer), and one the old
    // writer did write: content_inspection with "types": null.
    await db.query(
      `INSERT INTO service_config (service, scope_kind, org_id, group_id, key, value, locked, updated_by) VALUES ('llmproxy', 'org', 'org-a', '', 'model_policy', '{"mode":"sideways"}', false, 'dba')`,
    );
    const legacy =
      '{"immutable":false,"secrets_filter":{"enabled":true,"severity":"block"},"pii_detection":{"enabled":true,"severity":"warn","types":null},"api_key_detection":{"enabled":false,"severity":"warn"},"patterns":[]}';
    await db.query(
      `INSERT INTO agent_config (override_service, agent_id, org_id, key, value, updated_by) VALUES ('llmproxy', 'bot-1', 'org-a', 'content_inspection', $1, 'old-release')`,
      [legacy],
    );

    const res = await h.rawAt(cp.port, 'GET', '/v1/broker/snapshot', undefined, { authorization: `Bearer ${key}` });
    t.equal(res.status, 200, 'the snapshot is still served');
    const doc = JSON.parse(res.text);
    const loaded = validateSnapshot(doc);
    t.equal(loaded.orgs['org-a'].config.downstream_url?.value, 'https://llm.internal', 'the good rows are in it');
    t.notOk(loaded.orgs['org-a'].config.model_policy, 'the bad row is not');
    t.match(
      doc.skipped,
      [
        { scope: 'org:org-a', key: 'model_policy', reason: /mode: must be "allowlist" or "blocklist"/ },
        { scope: 'agent:bot-1', key: 'content_inspection', reason: /types: must be an array/ },
      ],
      'and each skipped row is named with its scope and key',
    );
    const effective = await at('GET', '/agents/bot-1/effective-policy');
    t.equal(effective.status, 200, 'the effective-policy read too');
    t.equal(effective.body.skipped.length, 2);
    // The effective-governance read skips (and names) a governance row or pack that does not validate the same way.
    await db.query(
      `INSERT INTO governance_policy (kind, scope_kind, org_id, group_id, agent_id, value, locked, updated_by) VALUES ('destination', 'org', 'org-a', '', '', '{"allow": "everything"}', false, 'dba'), ('exec', 'platform', '', '', '', 'not json', false, 'dba')`,
    );
    t.equal((await at('PUT', '/policies/ssh?scope=org&org=org-a', { enabled: true })).status, 200);
    const gov = await at('GET', '/agents/bot-1/effective-governance');
    t.equal(gov.status, 200, 'the effective-governance read is served');
    t.equal(gov.body.ssh, true, 'with the good rows');
    // The governance rows are in the snapshot now (key KIND_policy), built in its order: orgs, then the platform.
    t.match(gov.body.skipped, [
      { scope: 'org:org-a', key: 'destination_policy', reason: /allow: must be an array/ },
      { scope: 'platform', key: 'exec_policy', reason: /JSON/ },
    ]);
    t.equal(gov.body.skipped.length, 2, "the effective-governance read names its own rows, not the settings'");
    const counted = (await cp.registry.getSingleMetric('dvx_controlplane_policy_rows_skipped_total')!.get()).values;
    t.same(
      counted.map((v) => [v.labels.key, v.value]).sort(),
      [
        ['content_inspection', 2],
        ['destination_policy', 1],
        ['exec_policy', 1],
        ['model_policy', 2],
      ],
      'counted on every build that skips them',
    );

    // The migration rewrites what the old writer stored to what it meant ("types" omitted: every type).
    await db.query(`DELETE FROM schema_migrations WHERE version = '0010'`);
    const store = await openDb(pgdb.dsn);
    t.same(await migrate(store), ['0010']);
    await store.close();
    const fixed = (await db.query(`SELECT value FROM agent_config WHERE agent_id = 'bot-1'`)).rows[0].value;
    t.notOk('types' in JSON.parse(fixed).pii_detection);
    const after = JSON.parse(
      (await h.rawAt(cp.port, 'GET', '/v1/broker/snapshot', undefined, { authorization: `Bearer ${key}` })).text,
    );
    t.same(
      after.skipped.map((s: { scope: string; key: string }) => `${s.scope} ${s.key}`),
      ['org:org-a model_policy', 'org:org-a destination_policy', 'platform exec_policy'],
      'the legacy row is served again (the bad governance rows are skipped from the snapshot too)',
    );
    t.same(
      (
        validateSnapshot(after).agents['bot-1'].config.content_inspection?.value as
          | { pii_detection: unknown }
          | undefined
      )?.pii_detection,
      { enabled: true, severity: 'warn', types: null },
    );
  },
);
