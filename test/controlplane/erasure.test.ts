import t from 'tap';
import { mkdtemp, rm, readFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { openDb } from '../../core/sql.ts';
import { openStore } from '../../audit-wal/store.ts';
import { openKms } from '../../core/kms.ts';
import { OrgKeys } from '../../controlplane/crypto/org-keys.ts';
import { OrgKeyShredded } from '../../controlplane/errors.ts';
import { startCpHarness } from '../fixtures/controlplane-harness.ts';
import { freshPgDatabase } from '../fixtures/pg-database.ts';

// Per-org erasure end to end: sensitive columns sealed at rest under the org's data key, the key
// destroyed, the org's rows swept from the control plane's store and from the audit store (PostgreSQL
// and ClickHouse), nothing of the org readable or decryptable after, the erasure audited, and an
// interrupted sweep resumed at the next start.
const dir = await mkdtemp(join(tmpdir(), 'dvx-erasure-'));
t.teardown(() => rm(dir, { recursive: true, force: true }));
const chUp = await fetch('http://127.0.0.1:8123/ping').then(
  (r) => r.ok,
  () => false,
);
if (!chUp && process.env.CI) t.fail('ClickHouse is not running on 127.0.0.1:8123');
const chDb = `dvx_erasure_${Date.now().toString(36)}`;
if (chUp)
  t.teardown(() =>
    fetch(`http://127.0.0.1:8123/?query=${encodeURIComponent(`DROP DATABASE IF EXISTS ${chDb}`)}`, {
      method: 'POST',
    }).then(() => {}),
  );
const h = await startCpHarness([{ clientId: 'root', org: 'org-a', human: true }], { seedAdmin: ['root'] });
t.teardown(() => h.close());

const audits: [string, (name: string) => Promise<string | null>][] = [
  ['postgres', async (name) => (await freshPgDatabase(`dvx_erasure_audit_${name}`))?.dsn ?? null],
  ['clickhouse', async () => (chUp ? `clickhouse://default@127.0.0.1:8123/${chDb}` : null)],
];

for (const [auditKind, auditDsnOf] of audits) {
  t.test(`audit store ${auditKind}`, async (t) => {
    const cpDb = await freshPgDatabase(`dvx_erasure_cp_${auditKind}`);
    const auditDsn = await auditDsnOf(auditKind);
    if (!cpDb || !auditDsn) {
      if (process.env.CI) t.fail('a store is missing');
      return;
    }
    t.teardown(() => cpDb.drop());
    const kmsConfig = join(dir, `kms-${auditKind}.json`);
    const options = {
      seedAdmin: ['root'],
      databaseDsn: cpDb.dsn,
      auditDsn,
      auditWalDir: join(dir, `wal-${auditKind}`),
      kmsProvider: 'local',
      kmsConfig,
    };
    let cp = await h.start(options, null);
    const call = (method: string, path: string, body?: unknown) => h.callAt(cp.port, 'root', method, path, body);
    for (const id of ['org-a', 'org-b', 'org-c']) await call('POST', '/orgs', { id, name: id });
    await call('POST', '/config/email?scope=org&org=org-a', { value: 'dpo@a.example' });
    await call('POST', '/config/email?scope=org&org=org-b', { value: 'dpo@b.example' });
    await call('PUT', '/orgs/org-a/idp-connectors/corp', {
      type: 'oidc',
      issuer: 'https://login.a.example',
      client_id: 'c',
      client_secret: 'top-secret-a',
    });
    await call('POST', '/orgs/org-a/agents', { uid: 'bot-a', name: 'a' });
    await call('POST', '/config/email?scope=org&org=org-c', { value: 'dpo@c.example' });
    const audit = await openStore(auditDsn);
    t.teardown(() => audit.close());
    await audit.ensureSchema();
    await audit.insert('audit_events', [
      {
        id: `${auditKind}-e1`,
        event_time: new Date().toISOString(),
        kind: 'event',
        action: 'x',
        actor: 'u',
        org_id: 'org-a',
        attrs: { note: 'personal' },
      },
      {
        id: `${auditKind}-e2`,
        event_time: new Date().toISOString(),
        kind: 'event',
        action: 'x',
        actor: 'u',
        org_id: 'org-b',
      },
    ]);
    await audit.insert('llm_audit_log', [
      { id: `${auditKind}-l1`, event_time: new Date().toISOString(), org_id: 'org-a', agent_id: 'bot-a', status: 200 },
    ]);

    const db = await openDb(cpDb.dsn);
    t.teardown(() => db.close());
    const stored = (await db.query<{ value: string }>(`SELECT value FROM config_values WHERE org_id = 'org-a'`)).rows[0]
      .value;
    t.match(stored, /^enc:v1:/, 'config values are sealed at rest');
    t.notOk(stored.includes('dpo@a'));
    t.match(
      (await db.query<{ client_secret: string }>(`SELECT client_secret FROM idp_connectors WHERE org_id = 'org-a'`))
        .rows[0].client_secret,
      /^enc:v1:/,
      'so is the IdP client secret',
    );
    t.same(
      (await call('GET', '/config?scope=org&org=org-a')).body[0].value,
      'dpo@a.example',
      'and read back in the clear',
    );
    t.match(JSON.parse(await readFile(kmsConfig, 'utf8')), { key: String }, 'the local KMS made its master key');

    t.equal((await call('GET', '/orgs/org-a/erasure')).status, 404, 'not erased yet');
    const started = await call('POST', '/orgs/org-a/erasure');
    t.equal(started.status, 202);
    t.same(started.body, { org_id: 'org-a', status: 'running' });
    let result = (await call('GET', '/orgs/org-a/erasure')).body;
    for (let i = 0; i < 200 && result.status !== 'complete'; i++) {
      await new Promise((r) => setTimeout(r, 50));
      result = (await call('GET', '/orgs/org-a/erasure')).body;
    }
    t.match(result, { org_id: 'org-a', status: 'complete', key_shredded: true });
    t.ok(result.rows_swept >= 8, `${result.rows_swept} rows swept`);
    t.equal((await call('POST', '/orgs/org-a/erasure')).status, 200, 'asking again answers the finished erasure');

    t.equal((await call('GET', '/orgs/org-a')).status, 404);
    t.equal(
      (
        await db.query(
          `SELECT 1 FROM config_values WHERE org_id = 'org-a' UNION ALL SELECT 1 FROM agents WHERE org_id = 'org-a' UNION ALL SELECT 1 FROM idp_connectors WHERE org_id = 'org-a'`,
        )
      ).rows.length,
      0,
      'no row of the org in the control plane',
    );
    const keys = new OrgKeys(db, await openKms('local', kmsConfig));
    await t.rejects(keys.open('org-a', stored), OrgKeyShredded, 'a copy of a sealed value can no longer be opened');
    t.equal(
      await keys.open(
        'org-b',
        (await db.query<{ value: string }>(`SELECT value FROM config_values WHERE org_id = 'org-b'`)).rows[0].value,
      ),
      '"dpo@b.example"',
      'other orgs are untouched',
    );
    const left = await audit.readEvents({ predicate: { orgs: ['org-a'] }, filters: {}, limit: 100, offset: 0 });
    t.same(left, [], 'no audit record of the org');
    t.same(await audit.readLlm({ org: 'org-a', agentId: 'bot-a', limit: 10, offset: 0 }), []);
    t.equal(
      (await audit.readEvents({ predicate: { orgs: ['org-b'] }, filters: {}, limit: 100, offset: 0 })).length > 0,
      true,
      'org-b keeps its records',
    );
    t.equal((await call('POST', '/orgs', { id: 'org-a', name: 'again' })).status, 409, 'an erased id is not reused');
    // The erasure itself is audited (at platform scope, outside the swept org).
    let seen = false;
    for (let i = 0; i < 100 && !seen; i++) {
      seen = (await call('GET', '/audit/events?action=org.erase')).body.records?.some(
        (r: { resource: string }) => r.resource === 'org:org-a',
      );
      if (!seen) await new Promise((r) => setTimeout(r, 100));
    }
    t.ok(seen, 'the erasure is in the platform audit');

    // Restart safety: an erasure interrupted mid-way (recorded running, key not yet destroyed) resumes.
    await cp.close();
    await db.query(`INSERT INTO erasures (org_id, status, requested_by) VALUES ('org-c', 'running', 'root')`);
    cp = await h.start(options, null);
    t.teardown(() => cp.close());
    let resumed = (await call('GET', '/orgs/org-c/erasure')).body;
    for (let i = 0; i < 200 && resumed.status !== 'complete'; i++) {
      await new Promise((r) => setTimeout(r, 50));
      resumed = (await call('GET', '/orgs/org-c/erasure')).body;
    }
    t.match(resumed, { org_id: 'org-c', status: 'complete', key_shredded: true });
    t.equal((await call('GET', '/orgs/org-c')).status, 404, 'resumed and finished after the restart');
  });
}

t.test('options', async (t) => {
  await t.rejects(h.start({ kmsProvider: 'aws' }), /--kms-provider aws is not available/);
  await t.rejects(h.start({ kmsProvider: 'local' }), /needs --kms-config/);
});
