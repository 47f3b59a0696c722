import t from 'tap';
import { mkdir, readdir, readFile, rm, stat, symlink } from 'node:fs/promises';
import { join } from 'node:path';
import { getAgent, listAgents } from '../../../enclave/broker/agents.ts';
import { reconcileAgents } from '../../../enclave/broker/convergence.ts';
import { validateSnapshot } from '../../../pipeline/policy/snapshot.ts';
import { brokerStore } from '../../fixtures/broker-store.ts';

// broker_agents converging on a snapshot as a hostile or broken control plane could serve it: uids that
// are not file names, a symlink planted in the host dir, an audit store that is down, a token that
// expired, an agent that arrives suspended. The end-to-end path is test/enclave/broker/convergence.test.ts.

const store = await brokerStore({ enclaveId: 'enc-1' });
t.teardown(() => store.close());
const { deps } = store;
const hostDir = deps.options.agentHostDir;

const agent = (status = 'created', extra: Record<string, unknown> = {}) => ({
  org_id: 'org-a',
  group_id: 'ops',
  name: 'n',
  status,
  contained: false,
  ...extra,
});
const snapshot = (agents: Record<string, unknown>) =>
  validateSnapshot(JSON.parse(JSON.stringify({ version: 'v', enclave: { id: 'enc-1' }, agents })));

t.test('a uid that is not a safe file name is refused; nothing is written outside the host dir', async (t) => {
  const evil = ['../evil', '..', '.', '.hidden', 'a/b', '/abs', 'x\u0000y', 'a..b', `..${'/..'.repeat(8)}/tmp/x`];
  const agents: Record<string, unknown> = { 'ok-1': agent() };
  for (const uid of evil) agents[uid] = agent();
  const before = await readdir(store.stateDir);
  const { failed } = await reconcileAgents(deps, snapshot(agents));
  t.equal(failed, 0, 'a refused uid is skipped, not retried');
  t.same(
    (await listAgents(deps.db)).map((a) => a.uid),
    ['ok-1'],
    'only the safe one is taken',
  );
  t.same(await readdir(hostDir), ['ok-1']);
  t.same(await readdir(store.stateDir), [...new Set([...before, 'agents'])].sort(), 'nothing beside the host dir');
  t.ok(
    store.logs.some((l) => l.includes('not a safe file name') && l.includes('../evil')),
    'logged',
  );
  t.equal(store.audit.filter((r) => r.action === 'agent.provision').length, 1);
  // Once only: the same snapshot again does not log it again.
  const lines = store.logs.length;
  await reconcileAgents(deps, snapshot(agents));
  t.notOk(store.logs.slice(lines).some((l) => l.includes('not a safe file name')));
});

t.test('a symlink planted in the host dir is refused; nothing is stored, then it is tried again', async (t) => {
  const outside = join(store.stateDir, 'outside');
  await mkdir(outside);
  await symlink(outside, join(hostDir, 'bot-s'));
  const { failed } = await reconcileAgents(deps, snapshot({ 'ok-1': agent(), 'bot-s': agent() }));
  t.equal(failed, 1);
  t.same(await readdir(outside), [], 'nothing written through it');
  t.equal(await getAgent(deps.db, 'bot-s'), null, 'no row: the change rolled back');
  t.same((await deps.db.query(`SELECT 1 FROM broker_bootstrap_tokens WHERE agent_uid = 'bot-s'`)).rows, []);
  t.ok(store.logs.some((l) => l.includes('DVX_BROKER_AGENT_HOST_DIR')));
  await rm(join(hostDir, 'bot-s'));
  t.equal((await reconcileAgents(deps, snapshot({ 'ok-1': agent(), 'bot-s': agent() }))).failed, 0);
  t.match(await getAgent(deps.db, 'bot-s'), { status: 'provisioning' });
  t.match(await readFile(join(hostDir, 'bot-s', 'bootstrap-token'), 'utf8'), /^dvxb_/);
});

t.test('the audit store down: nothing is provisioned (capture-or-deny); it is done once it is back', async (t) => {
  const real = deps.audit;
  deps.audit = {
    append: () => Promise.reject(new Error('audit store down')),
    flush: () => Promise.resolve(),
    close: () => Promise.resolve(),
  };
  const agents = { 'ok-1': agent(), 'bot-s': agent(), 'bot-a': agent() };
  const { failed } = await reconcileAgents(deps, snapshot(agents));
  t.equal(failed, 1);
  t.equal(await getAgent(deps.db, 'bot-a'), null);
  await t.rejects(stat(join(hostDir, 'bot-a', 'bootstrap-token')), { code: 'ENOENT' }, 'no token delivered');
  deps.audit = real;
  t.equal((await reconcileAgents(deps, snapshot(agents))).failed, 0);
  t.match(await getAgent(deps.db, 'bot-a'), { status: 'provisioning' });
});

t.test('an expired bootstrap token is replaced', async (t) => {
  const first = await readFile(join(hostDir, 'bot-a', 'bootstrap-token'), 'utf8');
  await deps.db.query(
    `UPDATE broker_bootstrap_tokens SET expires_at = now() - interval '1 second' WHERE agent_uid = 'bot-a'`,
  );
  await reconcileAgents(deps, snapshot({ 'ok-1': agent(), 'bot-s': agent(), 'bot-a': agent('provisioning') }));
  t.not(await readFile(join(hostDir, 'bot-a', 'bootstrap-token'), 'utf8'), first);
  t.ok(
    store.audit.some(
      (r) =>
        r.action === 'agent.provision' &&
        r.resource === 'agent:bot-a' &&
        (r.attrs as Record<string, string>).reason === 'bootstrap_token_expired',
    ),
  );
});

t.test('an agent that arrives suspended gets no token until it is restored', async (t) => {
  const base = { 'ok-1': agent(), 'bot-s': agent(), 'bot-a': agent('provisioning') };
  await reconcileAgents(deps, snapshot({ ...base, 'bot-z': agent('suspended', { contained: true }) }));
  t.match(await getAgent(deps.db, 'bot-z'), { status: 'suspended', contained: true, reason: 'operator' });
  await t.rejects(stat(join(hostDir, 'bot-z')), { code: 'ENOENT' });
  await reconcileAgents(deps, snapshot({ ...base, 'bot-z': agent('active', { contained: true }) }));
  t.match(await getAgent(deps.db, 'bot-z'), { status: 'provisioning', contained: true, cp_status: 'active' });
  t.match(await readFile(join(hostDir, 'bot-z', 'bootstrap-token'), 'utf8'), /^dvxb_/);
  t.same(
    (await deps.db.query(`SELECT status FROM broker_status_outbox WHERE agent_uid = 'bot-z'`)).rows,
    [{ status: 'provisioning' }],
    'reported to the control plane',
  );
});

t.test('an empty snapshot removes every agent, and their files', async (t) => {
  await reconcileAgents(deps, snapshot({}));
  t.same(await listAgents(deps.db), []);
  t.same((await deps.db.query('SELECT 1 FROM broker_bootstrap_tokens')).rows, []);
  for (const uid of await readdir(hostDir)) t.same(await readdir(join(hostDir, uid)), [], `${uid}: no token left`);
});

t.test("an operator's suspension revokes the agent's credentials; the restore re-provisions it", async (t) => {
  const base = { 'ok-1': agent(), 'bot-s': agent(), 'bot-a': agent('provisioning') };
  await reconcileAgents(deps, snapshot({ ...base, 'bot-r': agent() }));
  // The agent bootstrapped: active, with a live refresh-token family.
  await deps.db.query(`UPDATE broker_agents SET status = 'active', cp_status = 'active' WHERE uid = 'bot-r'`);
  await deps.db.query(`UPDATE broker_bootstrap_tokens SET used_at = now() WHERE agent_uid = 'bot-r'`);
  await deps.db.query(`INSERT INTO broker_token_families (family_id, agent_uid) VALUES ('fam-r', 'bot-r')`);
  await deps.db.query(
    `INSERT INTO broker_refresh_tokens (token_hash, family_id, agent_uid, expires_at) VALUES ('h-r', 'fam-r', 'bot-r', now() + interval '1 hour')`,
  );
  await reconcileAgents(deps, snapshot({ ...base, 'bot-r': agent('active') }));
  t.match(await getAgent(deps.db, 'bot-r'), { status: 'active' }, 'a live family: nothing to do');

  await reconcileAgents(deps, snapshot({ ...base, 'bot-r': agent('suspended') }));
  t.match(await getAgent(deps.db, 'bot-r'), { status: 'suspended', reason: 'operator' });
  t.match(
    (await deps.db.query(`SELECT revoked_reason FROM broker_token_families WHERE family_id = 'fam-r'`)).rows,
    [{ revoked_reason: 'operator_suspended' }],
    'the family died with the suspension',
  );
  const before = await readFile(join(hostDir, 'bot-r', 'bootstrap-token'), 'utf8');
  await reconcileAgents(deps, snapshot({ ...base, 'bot-r': agent('active') }));
  t.match(await getAgent(deps.db, 'bot-r'), { status: 'provisioning', reason: 'restored' });
  t.not(await readFile(join(hostDir, 'bot-r', 'bootstrap-token'), 'utf8'), before, 'a new bootstrap token');
});

t.test(
  'an active agent whose credentials lapsed, or were revoked by a released containment, is re-provisioned',
  async (t) => {
    const base = { 'ok-1': agent(), 'bot-s': agent(), 'bot-a': agent('provisioning') };
    await reconcileAgents(deps, snapshot({ ...base, 'bot-l': agent() }));
    await deps.db.query(`UPDATE broker_agents SET status = 'active', cp_status = 'active' WHERE uid = 'bot-l'`);
    await deps.db.query(`UPDATE broker_bootstrap_tokens SET used_at = now() WHERE agent_uid = 'bot-l'`);
    await deps.db.query(`INSERT INTO broker_token_families (family_id, agent_uid) VALUES ('fam-l', 'bot-l')`);
    await deps.db.query(
      `INSERT INTO broker_refresh_tokens (token_hash, family_id, agent_uid, expires_at) VALUES ('h-l', 'fam-l', 'bot-l', now() + interval '1 hour')`,
    );
    // Contained: refused, and its family revoked; no token while contained.
    await reconcileAgents(deps, snapshot({ ...base, 'bot-l': agent('active', { contained: true }) }));
    t.match(await getAgent(deps.db, 'bot-l'), { status: 'active', contained: true });
    t.match((await deps.db.query(`SELECT revoked_reason FROM broker_token_families WHERE family_id = 'fam-l'`)).rows, [
      { revoked_reason: 'operator_contained' },
    ]);
    await reconcileAgents(deps, snapshot({ ...base, 'bot-l': agent('active', { contained: true }) }));
    t.match(await getAgent(deps.db, 'bot-l'), { status: 'active' }, 'still contained: not provisioned');
    // Released: nothing left to authenticate with, so a new bootstrap token.
    await reconcileAgents(deps, snapshot({ ...base, 'bot-l': agent('active') }));
    t.match(await getAgent(deps.db, 'bot-l'), {
      status: 'provisioning',
      contained: false,
      reason: 'credentials_lapsed',
    });
    t.match(await readFile(join(hostDir, 'bot-l', 'bootstrap-token'), 'utf8'), /^dvxb_/);
  },
);
