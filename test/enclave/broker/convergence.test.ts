import t, { type Test } from 'tap';
import { readFile, stat } from 'node:fs/promises';
import { join } from 'node:path';
import pg from 'pg';
import type { Queryable } from '../../../core/sql.ts';
import { changeStatus, getAgent } from '../../../enclave/broker/agents.ts';
import { redeemBootstrapToken } from '../../../enclave/broker/bootstrap-tokens.ts';
import { startConvergence, type Convergence } from '../../../enclave/broker/convergence.ts';
import type { BrokerDeps } from '../../../enclave/broker/deps.ts';
import { getState } from '../../../enclave/broker/state.ts';
import { validateConfigDocument } from '../../../pipeline/policy/config-values.ts';
import { validateSnapshot } from '../../../pipeline/policy/snapshot.ts';
import { startCpHarness } from '../../fixtures/controlplane-harness.ts';
import { brokerStore, type BrokerStore } from '../../fixtures/broker-store.ts';
import { until } from '../../fixtures/eventually.ts';
import { freshPgDatabase } from '../../fixtures/pg-database.ts';
import { startTcpProxy } from '../../fixtures/tcp-proxy.ts';

// The broker following a real control plane (behind a TCP relay the test can cut), on PGlite and on
// PostgreSQL: an operator's new agent gets its bootstrap token in its host within seconds and shows
// `provisioning`; the broker keeps its cursor and state across a restart (nothing provisioned twice);
// the operator's suspend, isolate, containment and restore are enforced within seconds; a control plane
// that is away stops nothing (the broker restarts from its store, its reports wait); a deleted agent
// loses everything it could authenticate with.

const cph = await startCpHarness(
  [
    { clientId: 'root', org: 'org-a', human: true },
    { clientId: 'admin-a', org: 'org-a', human: true },
  ],
  { seedAdmin: ['root'] },
);
t.teardown(() => cph.close());

const pgCp = await freshPgDatabase('dvx_bconv_cp');
const pgBroker = pgCp ? await freshPgDatabase('dvx_bconv_store') : null;
if (!pgCp && process.env.CI) t.fail('PostgreSQL is not reachable on 127.0.0.1:5432');
t.teardown(async () => {
  await pgCp?.drop();
  await pgBroker?.drop();
});

const WITHIN = 10_000;

async function backend(t: Test, kind: 'pglite' | 'postgres') {
  const cp = kind === 'pglite' ? cph.cp : await cph.start({ seedAdmin: ['root'], databaseDsn: pgCp!.dsn });
  if (kind === 'postgres') t.teardown(() => cp.close());
  const relay = await startTcpProxy(cp.port);
  t.teardown(() => relay.close());
  const call = (who: string, method: string, path: string, body?: unknown) =>
    cph.callAt(cp.port, who, method, path, body);
  await call('root', 'POST', '/orgs', { id: 'org-a', name: 'A' });
  await call('root', 'POST', '/orgs/org-a/groups', { id: 'ops', name: 'Ops' });
  await call('root', 'POST', '/orgs/org-a/grants', { principal: 'user:admin-a', role: 'org-admin' });
  await call('root', 'POST', '/config/region?scope=org&org=org-a', { value: 'eu' });
  const brokerToken = (
    await call('root', 'POST', '/enclaves', { name: 'eu', enclave_id: 'enc-1', owning_org: 'org-a' })
  ).body.key.token as string;
  const cpView = async (uid: string) => (await call('admin-a', 'GET', `/orgs/org-a/agents/${uid}`)).body;
  const create = (uid: string) =>
    call('admin-a', 'POST', '/orgs/org-a/agents', { uid, name: `name-${uid}`, group: 'ops', enclave_id: 'enc-1' });

  const store: BrokerStore = await brokerStore(
    { enclaveId: 'enc-1', pullInterval: 60_000, snapshotOut: '', configOut: '' },
    kind === 'postgres' ? pgBroker!.dsn : undefined,
  );
  t.teardown(() => store.close());
  let deps: BrokerDeps = store.deps;
  const hostDir = deps.options.agentHostDir;
  const snapshotOut = join(store.stateDir, 'policy.json');
  const configOut = join(store.stateDir, 'config.json');
  const tokenFile = (uid: string) => join(hostDir, uid, 'bootstrap-token');
  const start = (d: BrokerDeps) =>
    startConvergence(d, {
      controlplane: `https://127.0.0.1:${relay.port}`,
      brokerToken,
      ca: cph.ca,
      statusPollMs: 200,
      snapshotOut,
      configOut,
    });
  let conv: Convergence = await start(deps);
  t.teardown(() => conv.close());
  const row = (uid: string) => getAgent(deps.db, uid);
  const provisions = (uid: string) =>
    store.audit.filter((r) => r.action === 'agent.provision' && r.resource === `agent:${uid}`).length;
  /** What the agent-side exchange does with its bootstrap token (the identity routes' part, done by hand). */
  const bootstrap = async (uid: string) => {
    const token = await readFile(tokenFile(uid), 'utf8');
    await deps.db.transaction(async (tx: Queryable) => {
      t.equal(await redeemBootstrapToken(tx, token, Date.now()), uid, `${uid}'s token is live and bound to it`);
      await changeStatus(tx, uid, 'active', 'bootstrapped');
      await tx.query('INSERT INTO broker_token_families (family_id, agent_uid) VALUES ($1, $2)', [`fam-${token}`, uid]);
      await tx.query(
        `INSERT INTO broker_refresh_tokens (token_hash, family_id, agent_uid, expires_at) VALUES ($1, $2, $3, now() + interval '1 hour')`,
        [`rt-${token}`, `fam-${token}`, uid],
      );
    });
    deps.bus.emit('agent', uid);
    return token;
  };
  const secretsInLogs = (token: string) =>
    store.logs.some((l) => l.includes(token)) || JSON.stringify(store.audit).includes(token);

  await conv.ready;

  await t.test('an operator creates an agent: its token file appears and agentView shows provisioning', async (t) => {
    t.equal((await create('bot-1')).status, 201);
    t.ok(await until(() => stat(tokenFile('bot-1')).then(() => true), WITHIN), 'the token file appears');
    t.equal((await stat(tokenFile('bot-1'))).mode & 0o777, 0o600);
    t.equal((await stat(join(hostDir, 'bot-1'))).mode & 0o777, 0o700);
    const token = await readFile(tokenFile('bot-1'), 'utf8');
    t.match(token, /^dvxb_[A-Za-z0-9_-]{43}$/);
    t.match(await row('bot-1'), { status: 'provisioning', org_id: 'org-a', group_id: 'ops', name: 'name-bot-1' });
    t.ok(await until(async () => (await cpView('bot-1')).status === 'provisioning', WITHIN), 'agentView: provisioning');
    t.match(
      store.audit.find((r) => r.action === 'agent.provision'),
      { actor: 'enclave:enc-1', resource: 'agent:bot-1', org_id: 'org-a', enclave_id: 'enc-1', outcome: 'allow' },
      'audited as the enclave',
    );
    t.notOk(secretsInLogs(token), 'the token is in no log line and no audit record');

    // The satellites' files, as `dvx policy-pull` / `dvx config-pull` write them; the state kept.
    t.ok(
      await until(async () => {
        const file = validateSnapshot(JSON.parse(await readFile(snapshotOut, 'utf8')));
        return file.agents['bot-1'] !== undefined;
      }, WITHIN),
      'the snapshot file carries the agent',
    );
    const served = async () =>
      JSON.parse(
        (await cph.rawAt(cp.port, 'GET', '/v1/broker/snapshot', undefined, { authorization: `Bearer ${brokerToken}` }))
          .text,
      );
    const written = async () => JSON.parse(await readFile(snapshotOut, 'utf8'));
    t.ok(
      await until(
        async () =>
          JSON.stringify({ ...(await written()), version: 0 }) === JSON.stringify({ ...(await served()), version: 0 }),
        WITHIN,
      ),
      'the file is what the control plane serves',
    );
    t.equal(
      validateConfigDocument(JSON.parse(await readFile(configOut, 'utf8'))).orgs['org-a'].config.region.value,
      'eu',
    );
    t.match(await getState(deps.db, 'snapshot'), { enclave: { id: 'enc-1' }, agents: { 'bot-1': {} } });
    t.match(await getState(deps.db, 'config'), { orgs: { 'org-a': {} } });
    t.ok(await until(async () => /^\d+$/.test(String(await getState(deps.db, 'events_cursor'))), WITHIN));
    t.equal(conv.snapshot()?.agents['bot-1']?.org_id, 'org-a');
    t.equal(conv.config()?.enclave.id, 'enc-1');
  });

  await t.test('the agent bootstraps: active reaches the control plane', async (t) => {
    await bootstrap('bot-1');
    t.ok(await until(async () => (await cpView('bot-1')).status === 'active', WITHIN), 'agentView: active');
    t.ok(
      await until(async () => (await row('bot-1'))?.cp_status === 'active', WITHIN),
      'and comes back in the snapshot',
    );
    t.equal((await row('bot-1'))?.status, 'active');
    t.equal(provisions('bot-1'), 1, 'provisioned once');
  });

  await t.test('restarted mid-way: its cursor and state are kept, nothing is provisioned twice', async (t) => {
    const cursorBefore = Number(await getState(deps.db, 'events_cursor'));
    await conv.close();
    t.equal((await create('bot-2')).status, 201, 'created while the broker is down');
    deps = await store.reopen();
    conv = await start(deps);
    t.equal(conv.snapshot()?.agents['bot-1']?.status, 'active', 'the kept snapshot, at once');
    t.ok(conv.config(), 'the kept config, at once');
    t.ok(await until(() => stat(tokenFile('bot-2')).then(() => true), WITHIN), 'the new agent is provisioned');
    await conv.ready;
    t.equal(provisions('bot-1'), 1, 'bot-1 is not provisioned again');
    t.equal(provisions('bot-2'), 1);
    t.equal((await row('bot-1'))?.status, 'active');
    t.ok(
      await until(async () => Number(await getState(deps.db, 'events_cursor')) > cursorBefore, WITHIN),
      'the cursor moved on from where it was',
    );
    if (kind === 'postgres') {
      // The control plane marks consumed what a stream resumed past: the broker resumed with its cursor.
      const c = new pg.Client({ connectionString: pgCp!.dsn });
      await c.connect();
      const { rows } = await c.query(
        `SELECT count(*)::int AS n FROM events WHERE enclave_id = 'enc-1' AND id <= $1 AND consumed_at IS NULL`,
        [cursorBefore],
      );
      await c.end();
      t.equal(rows[0].n, 0, 'resumed with Last-Event-ID');
    }
  });

  await t.test("the operator's suspend, isolate and containment are enforced within seconds", async (t) => {
    const told: string[] = [];
    const listen = (uid: string) => void told.push(uid);
    deps.bus.on('agent', listen);
    t.teardown(() => void deps.bus.off('agent', listen));
    await call('admin-a', 'POST', '/orgs/org-a/agents/bot-1/suspend');
    t.ok(await until(async () => (await row('bot-1'))?.status === 'suspended', WITHIN), 'suspended');
    t.match(await row('bot-1'), { reason: 'operator', cp_status: 'suspended' });
    t.ok(told.includes('bot-1'), 'the rest of the broker is told');
    t.ok(store.audit.some((r) => r.action === 'agent.suspend' && r.resource === 'agent:bot-1'));
    await call('admin-a', 'POST', '/orgs/org-a/agents/bot-1/containment', { contained: true });
    t.ok(await until(async () => (await row('bot-1'))?.contained === true, WITHIN), 'contained');
    await call('admin-a', 'POST', '/orgs/org-a/agents/bot-1/containment', { contained: false });
    t.ok(await until(async () => (await row('bot-1'))?.contained === false, WITHIN), 'released');
    t.equal((await cpView('bot-1')).status, 'suspended', 'the broker did not report over the operator');
  });

  await t.test("restore: the suspension revoked the agent's credentials, so it is provisioned again", async (t) => {
    const used = await readFile(tokenFile('bot-1'), 'utf8');
    t.match(
      (await deps.db.query('SELECT revoked_reason FROM broker_token_families WHERE agent_uid = $1', ['bot-1'])).rows,
      [{ revoked_reason: 'operator_suspended' }],
      'the suspension revoked its family',
    );
    await call('admin-a', 'POST', '/orgs/org-a/agents/bot-1/restore');
    t.ok(await until(async () => (await row('bot-1'))?.status === 'provisioning', WITHIN), 'provisioned again');
    t.ok(
      await until(async () => (await readFile(tokenFile('bot-1'), 'utf8')) !== used, WITHIN),
      'a new bootstrap token in its host',
    );
    const second = await readFile(tokenFile('bot-1'), 'utf8');
    await call('admin-a', 'POST', '/orgs/org-a/agents/bot-1/isolate');
    t.ok(await until(async () => (await row('bot-1'))?.status === 'isolated', WITHIN), 'isolated');
    await call('admin-a', 'POST', '/orgs/org-a/agents/bot-1/restore');
    t.ok(await until(async () => (await row('bot-1'))?.status === 'provisioning', WITHIN), 'provisioned again');
    t.ok(
      await until(async () => (await readFile(tokenFile('bot-1'), 'utf8')) !== second, WITHIN),
      'the unused token the isolation voided is replaced',
    );
    t.match(
      store.audit.filter((r) => r.action === 'agent.restore' && r.resource === 'agent:bot-1'),
      [{ attrs: { reprovisioned: 'true', was: 'suspended' } }, { attrs: { reprovisioned: 'true', was: 'isolated' } }],
      'each restore audited, saying what it did',
    );
    t.ok(await until(async () => (await cpView('bot-1')).status === 'provisioning', WITHIN), 'agentView follows');
  });

  await t.test('a replayed refresh token: suspended and reported; only a restore lets it back', async (t) => {
    await bootstrap('bot-2');
    t.ok(await until(async () => (await cpView('bot-2')).status === 'active', WITHIN));
    // What the refresh route does on a replay.
    await deps.db.transaction(async (tx) => {
      await tx.query(
        `UPDATE broker_token_families SET revoked_at = now(), revoked_reason = 'replayed' WHERE agent_uid = $1`,
        ['bot-2'],
      );
      await changeStatus(tx, 'bot-2', 'suspended', 'refresh_token_replayed');
    });
    deps.bus.emit('agent', 'bot-2');
    t.ok(await until(async () => (await cpView('bot-2')).status === 'suspended', WITHIN), 'agentView: suspended');
    t.ok(await until(async () => (await row('bot-2'))?.cp_status === 'suspended', WITHIN));
    await conv.reconcile();
    t.match(await row('bot-2'), { status: 'suspended', reason: 'refresh_token_replayed' }, 'not let back by itself');
    const used = await readFile(tokenFile('bot-2'), 'utf8');
    await call('admin-a', 'POST', '/orgs/org-a/agents/bot-2/restore');
    t.ok(await until(async () => (await row('bot-2'))?.status === 'provisioning', WITHIN), 're-provisioned');
    t.ok(await until(async () => (await readFile(tokenFile('bot-2'), 'utf8')) !== used, WITHIN), 'a new token');
    t.ok(
      store.audit.some(
        (r) => r.action === 'agent.restore' && (r.attrs as Record<string, string>)?.reprovisioned === 'true',
      ),
    );
  });

  await t.test("a report the operator's state refuses (409) is dropped; the operator's state comes back", async (t) => {
    await call('admin-a', 'POST', '/orgs/org-a/agents/bot-2/isolate');
    t.ok(await until(async () => (await row('bot-2'))?.status === 'isolated', WITHIN));
    // A change the broker made before it saw the isolation (an exchange racing the pull).
    await deps.db.transaction((tx) => changeStatus(tx, 'bot-2', 'active', 'bootstrapped'));
    deps.bus.emit('agent', 'bot-2');
    t.ok(
      await until(async () => (await deps.db.query('SELECT 1 FROM broker_status_outbox')).rows.length === 0, WITHIN),
      'the refused report leaves the outbox',
    );
    t.ok(
      store.logs.some((l) => l.includes("operator's state wins") && l.includes('bot-2')),
      'and is logged',
    );
    t.equal((await cpView('bot-2')).status, 'isolated', 'the control plane keeps it');
    await conv.reconcile();
    t.equal((await row('bot-2'))?.status, 'isolated', 'the broker enforces it again');
  });

  await t.test('the control plane away: the broker restarts from its store and its reports wait', async (t) => {
    await relay.cut();
    await bootstrap('bot-1'); // the agent exchanges its token while the control plane is away
    t.ok(
      await until(async () => {
        const r = await deps.db.query<{ attempts: number }>(
          'SELECT attempts FROM broker_status_outbox WHERE agent_uid = $1',
          ['bot-1'],
        );
        return (r.rows[0]?.attempts ?? 0) > 0;
      }, WITHIN),
      'the report is tried and kept',
    );
    await conv.close();
    deps = await store.reopen();
    conv = await start(deps);
    t.same(Object.keys(conv.snapshot()?.agents ?? {}).sort(), ['bot-1', 'bot-2'], 'its snapshot, from its store');
    t.ok(conv.config());
    t.match(await row('bot-1'), { status: 'active' });
    t.match(await row('bot-2'), { status: 'isolated' });
    t.equal(
      (await deps.db.query('SELECT status FROM broker_status_outbox WHERE agent_uid = $1', ['bot-1'])).rows.length,
      1,
      'the report is still queued',
    );
    const early = await Promise.race([
      conv.ready.then(() => 'ready'),
      new Promise((r) => setTimeout(r, 500, 'waiting')),
    ]);
    t.equal(early, 'waiting', 'not converged with the control plane while it is away');
    await relay.restore();
    t.ok(await until(async () => (await cpView('bot-1')).status === 'active', WITHIN), 'delivered once it is back');
    await conv.ready;
    t.ok(
      await until(async () => (await deps.db.query('SELECT 1 FROM broker_status_outbox')).rows.length === 0, WITHIN),
    );
  });

  await t.test('an agent deleted at the control plane loses everything it could authenticate with', async (t) => {
    const token = await readFile(tokenFile('bot-2'), 'utf8');
    t.equal((await call('admin-a', 'DELETE', '/orgs/org-a/agents/bot-2')).status, 204);
    t.ok(await until(async () => (await row('bot-2')) === null, WITHIN), 'removed');
    t.ok(
      await until(
        () =>
          stat(tokenFile('bot-2')).then(
            () => false,
            (err) => err.code === 'ENOENT',
          ),
        WITHIN,
      ),
      'its token file is gone',
    );
    t.equal(
      (await deps.db.query(`SELECT 1 FROM broker_token_families WHERE agent_uid = 'bot-2' AND revoked_at IS NULL`)).rows
        .length,
      0,
      'its families are revoked',
    );
    t.equal(await deps.db.transaction((tx) => redeemBootstrapToken(tx, token, Date.now())), null, 'its token is void');
    t.ok(store.audit.some((r) => r.action === 'agent.remove' && r.resource === 'agent:bot-2'));
    t.ok(await row('bot-1'), 'the others stay');
  });

  await t.test('a snapshot of another enclave is never applied', async (t) => {
    await conv.close();
    t.equal((await create('bot-3')).status, 201);
    const keptBefore = JSON.stringify(await getState(deps.db, 'snapshot'));
    // The same store, with an --enclave-id that is not the one the broker key belongs to.
    const other = { ...deps, enclave: { id: 'enc-other', name: 'other' } };
    const c = await startConvergence(other, {
      controlplane: `https://127.0.0.1:${relay.port}`,
      brokerToken,
      ca: cph.ca,
    });
    t.teardown(() => c.close());
    t.ok(
      await until(() => store.logs.some((l) => l.includes('DVX_BROKER_ENCLAVE_MISMATCH')), WITHIN),
      'refused, logged',
    );
    await c.close();
    t.equal(await row('bot-3'), null, 'no agent taken from it');
    t.equal(JSON.stringify(await getState(deps.db, 'snapshot')), keptBefore, 'the kept snapshot stays');
    await t.rejects(stat(join(hostDir, 'bot-3')), { code: 'ENOENT' }, 'nothing written');
  });
}

t.test('on PGlite', (t) => backend(t, 'pglite'));
t.test('on PostgreSQL', { skip: pgCp ? false : 'PostgreSQL is not reachable' }, (t) => backend(t, 'postgres'));
