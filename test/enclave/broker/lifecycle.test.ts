import t from 'tap';
import { mkdtemp, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { decodeJwt } from 'jose';
import { startBrokerHarness } from '../../fixtures/broker-harness.ts';
import { startCpHarness } from '../../fixtures/controlplane-harness.ts';
import { until } from '../../fixtures/eventually.ts';
import { freePort } from '../../fixtures/free-port.ts';
import { startHarness } from '../../fixtures/llmproxy-harness.ts';
import { freshPgDatabase } from '../../fixtures/pg-database.ts';
import { runDvx, type RunResult } from '../../fixtures/run-dvx.ts';

// The whole agent lifecycle on real parts: a control plane (PGlite) where operators author, a broker
// (PostgreSQL) converging on it, `dvx agent-login` run as the real CLI on the agent's side, and llmproxy
// verifying the broker's JWTs against its JWKS and taking the org's provider key from it, called by the
// official Anthropic SDK. Operator creates an agent → agent.created reaches the broker → the token file
// appears → agent-login bootstraps → the SDK calls llmproxy → renewal → a replayed refresh token: 409, the
// family dead, the control plane shows it → restore: provisioned again, bootstrapped again → suspend: 403
// on every agent route, the family revoked → restore: provisioned and bootstrapped again. Also: one
// winner of a concurrent bootstrap, a broker restarted mid-way keeps its state, a stopped control plane
// stops nothing, and no token or secret in any captured line.

const WITHIN = 15_000;
const ORG_KEY = 'sk-ant-org-key-3c9e1f7a-never-logged';
const AGENT_SECRET = 'agent-db-password-8d2b4a60-never-logged';

const pgBroker = await freshPgDatabase('dvx_lifecycle_broker');
if (!pgBroker && process.env.CI) t.fail('PostgreSQL is not reachable on 127.0.0.1:5432');
if (pgBroker) t.teardown(() => pgBroker.drop());
else t.comment('PostgreSQL is not reachable: the broker runs on PGlite');

/** A setup step that must hold (no assertion at the top level: tap would end the root test there). */
function must(ok: boolean, what: string): void {
  if (!ok) throw new Error(`setup failed: ${what}`);
}

const work = await mkdtemp(join(tmpdir(), 'dvx-lifecycle-'));
t.teardown(() => rm(work, { recursive: true, force: true }));

// The control plane, its org and operators, the enclave registered (its broker key).
const cph = await startCpHarness(
  [
    { clientId: 'root', org: 'org-a', human: true },
    { clientId: 'admin-a', org: 'org-a', human: true },
  ],
  { seedAdmin: ['root'] },
);
t.teardown(() => cph.close());
let cpStopped = false;
const cp = await cph.start({ seedAdmin: ['root'] });
t.teardown(() => (cpStopped ? undefined : cp.close()));
const call = (who: string, method: string, path: string, body?: unknown) =>
  cph.callAt(cp.port, who, method, path, body);
await call('root', 'POST', '/orgs', { id: 'org-a', name: 'A' });
await call('root', 'POST', '/orgs/org-a/groups', { id: 'ops', name: 'Ops' });
await call('root', 'POST', '/orgs/org-a/grants', { principal: 'user:admin-a', role: 'org-admin' });
const registered = await call('root', 'POST', '/enclaves', {
  name: 'eu-prod',
  enclave_id: 'enc-1',
  owning_org: 'org-a',
});
must(registered.status === 201, 'the enclave is registered');
const brokerKey = registered.body.key.token as string;
const cpCa = join(work, 'cp-ca.pem');
await writeFile(cpCa, cph.ca);

// The broker: converging on the control plane, bootstrap tokens under --agent-host-dir, the policy
// snapshot written for llmproxy, its own operators for the enclave's secrets.
const agentHostDir = join(work, 'agents');
const snapshotOut = join(work, 'policy-snapshot.json');
const h = await startBrokerHarness(
  {
    addr: `127.0.0.1:${await freePort()}`,
    controlplane: `https://127.0.0.1:${cp.port}`,
    brokerKey,
    caCert: cpCa,
    enclaveId: 'enc-1',
    enclaveName: 'eu-prod',
    agentHostDir,
    snapshotOut,
    seedAdmin: ['enclave-admin'],
    ...(pgBroker ? { databaseDsn: pgBroker.dsn } : {}),
  },
  [{ clientId: 'enclave-admin', org: 'org-a', human: true }],
);
t.teardown(() => h.close());
const brokerUrl = `https://127.0.0.1:${h.broker.agentPort}`;
const brokerCa = join(work, 'broker-ca.pem');
await writeFile(brokerCa, h.tls.ca.certPem);
must(await until(() => stat(snapshotOut).then(() => true), WITHIN), "the broker writes the enclave's snapshot");

// llmproxy: platform JWTs verified against the broker's JWKS, secrets from the broker, the snapshot
// the broker writes.
const proxy = await startHarness({
  proxy: {
    agentJwks: `${brokerUrl}/.well-known/jwks.json`,
    brokerCa,
    secretBrokerUrl: brokerUrl,
    secretBrokerTokenFile: h.broker.deps.options.satelliteTokenFile,
    secretsFile: '',
    policySnapshot: snapshotOut,
  },
});
t.teardown(() => proxy.close());
await call('root', 'PUT', '/platform/config/llmproxy/downstream_url', { value: JSON.stringify(proxy.upstream.url) });
must(
  (await h.operator('enclave-admin', 'PUT', '/api/v1/secrets/llmproxy:llm.api_key', { value: ORG_KEY })).status === 200,
  "the org's provider key is a broker secret",
);

// What every captured line is checked against at the end.
const secrets = new Set<string>([ORG_KEY, AGENT_SECRET, brokerKey]);
const printed: string[] = [];

const out = join(work, 'agent-out');
const tokenFile = (uid: string) => join(agentHostDir, uid, 'bootstrap-token');
/** `dvx agent-login --once` as the agent's host runs it; its output kept for the leak check. */
async function agentLogin(uid: string, dir = out): Promise<RunResult> {
  const r = await runDvx([
    'agent-login',
    '--broker',
    brokerUrl,
    '--token-file',
    tokenFile(uid),
    '--out',
    dir,
    '--ca-cert',
    brokerCa,
    '--once',
  ]);
  printed.push(r.stdout, r.stderr);
  for (const f of ['jwt', 'refresh-token'])
    await readFile(join(dir, f), 'utf8').then(
      (v) => secrets.add(v),
      () => undefined, // not written (yet): nothing to remember
    );
  return r;
}
const cpView = async (uid: string) => (await call('admin-a', 'GET', `/orgs/org-a/agents/${uid}`)).body;
const brokerRow = async (uid: string) =>
  (await h.broker.deps.db.query<{ status: string }>('SELECT status FROM broker_agents WHERE uid = $1', [uid])).rows[0];
const jwt = () => readFile(join(out, 'jwt'), 'utf8');
/** The agent's SDK, its key read from the file agent-login keeps. */
async function ask(text = 'hello'): Promise<number> {
  try {
    await proxy.anthropic(await jwt()).messages.create({
      model: 'claude-lifecycle-test',
      max_tokens: 16,
      messages: [{ role: 'user', content: text }],
    });
    return 200;
  } catch (err) {
    return (err as { status?: number }).status ?? 0;
  }
}
/** The agent routes that take the platform JWT, with the exchanges: every status. */
async function agentRoutes(token: string, refreshToken: string): Promise<number[]> {
  return [
    (await h.agent('GET', '/v1/agent/secrets', undefined, token)).status,
    (await h.agent('GET', '/v1/agent/secrets/db_password', undefined, token)).status,
    (await h.agent('GET', '/v1/agent/config', undefined, token)).status,
    (await h.agent('PUT', '/v1/agent/config/mood', { value: 'calm' }, token)).status,
    (await h.agent('POST', '/v1/agent/refresh', { refresh_token: refreshToken })).status,
  ];
}

t.test('an operator creates an agent: the broker provisions it, its token file appears', async (t) => {
  const created = await call('admin-a', 'POST', '/orgs/org-a/agents', {
    uid: 'bot-1',
    name: 'builder',
    group: 'ops',
    enclave_id: 'enc-1',
  });
  t.equal(created.status, 201);
  t.ok(await until(() => stat(tokenFile('bot-1')).then(() => true), WITHIN), 'the token file appears');
  t.equal((await stat(tokenFile('bot-1'))).mode & 0o777, 0o600);
  secrets.add((await readFile(tokenFile('bot-1'), 'utf8')).trim());
  t.ok(await until(async () => (await cpView('bot-1')).status === 'provisioning', WITHIN), 'agentView: provisioning');
  t.equal(
    (await h.operator('enclave-admin', 'PUT', '/api/v1/secrets/db_password?agent=bot-1', { value: AGENT_SECRET }))
      .status,
    200,
  );
});

t.test('dvx agent-login bootstraps; the SDK calls llmproxy with its JWT and the org key from the broker', async (t) => {
  const r = await agentLogin('bot-1');
  t.equal(r.code, 0, r.stderr);
  t.match(decodeJwt(await jwt()), { sub: 'bot-1', org_id: 'org-a', agent_name: 'builder', group_id: 'ops' });
  t.equal(await readFile(join(out, 'secrets', 'db_password'), 'utf8'), AGENT_SECRET, "the agent's own secret");
  t.same(JSON.parse(await readFile(join(out, 'identity.json'), 'utf8')), {
    agent_id: 'bot-1',
    org_id: 'org-a',
    agent_name: 'builder',
  });
  t.equal((await brokerRow('bot-1'))?.status, 'active');
  t.ok(await until(async () => (await cpView('bot-1')).status === 'active', WITHIN), 'agentView: active');

  // The snapshot llmproxy reads carries the upstream (the platform config) before the first call.
  t.ok(
    await until(async () => (await ask()) === 200, WITHIN),
    'the official SDK is served through llmproxy with the JWT agent-login wrote',
  );
  const last = proxy.upstream.received.at(-1)!;
  t.equal(last.headers['x-api-key'], ORG_KEY, "the org's key from the broker, injected by llmproxy");
  t.notOk(JSON.stringify(last.headers).includes(await jwt()), 'the JWT does not go upstream');
});

t.test('a refresh: agent-login resumes the family; the new JWT is served', async (t) => {
  const before = { jwt: await jwt(), refresh: await readFile(join(out, 'refresh-token'), 'utf8') };
  const r = await agentLogin('bot-1');
  t.equal(r.code, 0, r.stderr);
  t.match(r.stdout, /agent identity renewed/);
  t.not(await jwt(), before.jwt);
  t.not(await readFile(join(out, 'refresh-token'), 'utf8'), before.refresh, 'rotated');
  t.equal(await ask(), 200);
});

t.test('concurrent bootstraps with one token: exactly one wins', async (t) => {
  await call('admin-a', 'POST', '/orgs/org-a/agents', {
    uid: 'bot-2',
    name: 'twin',
    group: 'ops',
    enclave_id: 'enc-1',
  });
  t.ok(await until(() => stat(tokenFile('bot-2')).then(() => true), WITHIN));
  const token = (await readFile(tokenFile('bot-2'), 'utf8')).trim();
  secrets.add(token);
  const answers = await Promise.all(Array.from({ length: 8 }, () => h.agent('POST', '/v1/agent/bootstrap', { token })));
  for (const a of answers) if (a.status === 200) secrets.add(a.body.jwt).add(a.body.refresh_token);
  t.same(answers.map((a) => a.status).sort(), [200, 401, 401, 401, 401, 401, 401, 401], 'one 200, every other one 401');
});

t.test('the broker restarted mid-way keeps its state', async (t) => {
  const jwtBefore = await jwt();
  const jwks = (await h.agent('GET', '/.well-known/jwks.json')).body;
  await h.broker.close();
  await h.restart();
  t.equal(`https://127.0.0.1:${h.broker.agentPort}`, brokerUrl, 'on the same address');
  t.same((await h.agent('GET', '/.well-known/jwks.json')).body, jwks, 'the same signing keys');
  t.equal((await h.agent('GET', '/v1/agent/secrets', undefined, jwtBefore)).status, 200, 'a JWT minted before');
  t.equal((await brokerRow('bot-1'))?.status, 'active');
  const r = await agentLogin('bot-1');
  t.equal(r.code, 0, `the family lives on: ${r.stderr}`);
  t.equal(await ask(), 200);
});

let stolen = '';
t.test('a replayed refresh token: 409, the family dead, the control plane shows it', async (t) => {
  stolen = await readFile(join(out, 'refresh-token'), 'utf8');
  t.equal((await agentLogin('bot-1')).code, 0, 'the agent renews: the token it held is spent');
  const replay = await h.agent('POST', '/v1/agent/refresh', { refresh_token: stolen });
  t.equal(replay.status, 409);
  t.match(replay.type, /application\/problem\+json/);
  t.equal((await brokerRow('bot-1'))?.status, 'suspended');
  const r = await agentLogin('bot-1');
  t.equal(r.code, 4, 'the family is dead: agent-login stops for good');
  t.match(r.stderr, /refused \/v1\/agent\/refresh/);
  t.ok(
    await until(async () => (await cpView('bot-1')).status === 'suspended', WITHIN),
    "agentView shows the broker's suspension",
  );
  t.ok(await until(async () => (await ask()) === 403, WITHIN), 'llmproxy refuses the suspended agent');
});

t.test('restore on the control plane: provisioned again (a new token file); bootstrap works again', async (t) => {
  const old = (await readFile(tokenFile('bot-1'), 'utf8')).trim();
  t.equal((await call('admin-a', 'POST', '/orgs/org-a/agents/bot-1/restore')).status, 200);
  t.ok(
    await until(async () => (await readFile(tokenFile('bot-1'), 'utf8')).trim() !== old, WITHIN),
    'a new bootstrap token',
  );
  secrets.add((await readFile(tokenFile('bot-1'), 'utf8')).trim());
  const r = await agentLogin('bot-1');
  t.equal(r.code, 0, r.stderr);
  t.match(r.stdout, /agent bootstrapped/);
  t.equal((await brokerRow('bot-1'))?.status, 'active');
  t.ok(await until(async () => (await cpView('bot-1')).status === 'active', WITHIN));
  t.ok(await until(async () => (await ask()) === 200, WITHIN), 'served again');
});

t.test('suspend on the control plane: 403 on every agent route within seconds; restore lets it back', async (t) => {
  const token = await jwt();
  const refresh = await readFile(join(out, 'refresh-token'), 'utf8');
  t.same(await agentRoutes(token, 'x'.repeat(40)), [200, 200, 200, 200, 401], 'before: served');
  t.equal((await call('admin-a', 'POST', '/orgs/org-a/agents/bot-1/suspend')).body.status, 'suspended');
  t.ok(
    await until(async () => (await agentRoutes(token, refresh)).slice(0, 4).every((s) => s === 403), WITHIN),
    '403 on every route of the platform JWT',
  );
  // The suspension revoked what the agent held: its refresh token is refused too (401 once revoked).
  t.ok([401, 403].includes((await agentRoutes(token, refresh))[4]!), 'the refresh is refused');
  const refused = await agentLogin('bot-1');
  t.equal(refused.code, 4, 'agent-login is refused (exit 4)');
  t.ok(await until(async () => (await ask()) === 403, WITHIN), 'llmproxy refuses it too');
  const old = (await readFile(tokenFile('bot-1'), 'utf8')).trim();
  t.equal((await call('admin-a', 'POST', '/orgs/org-a/agents/bot-1/restore')).status, 200);
  t.ok(
    await until(async () => (await readFile(tokenFile('bot-1'), 'utf8').catch(() => old)).trim() !== old, WITHIN),
    'restored: provisioned again (a new bootstrap token)',
  );
  secrets.add((await readFile(tokenFile('bot-1'), 'utf8')).trim());
  const r = await agentLogin('bot-1');
  t.equal(r.code, 0, r.stderr);
  t.match(r.stdout, /redeeming the new bootstrap token/, 'its dead family found, the new token redeemed');
  t.equal((await brokerRow('bot-1'))?.status, 'active');
  t.ok(await until(async () => (await ask()) === 200, WITHIN), 'served again');
});

t.test('the control plane stopped: the broker keeps serving refresh and the JWKS', async (t) => {
  await cp.close();
  cpStopped = true;
  const r = await agentLogin('bot-1');
  t.equal(r.code, 0, r.stderr);
  t.equal((await h.agent('GET', '/.well-known/jwks.json')).status, 200);
  t.equal((await h.agent('GET', '/v1/agent/config', undefined, await jwt())).status, 200);
  t.equal(await ask(), 200, 'llmproxy still serves the agent with the renewed JWT');
});

t.test('no token, key or secret value reached any line captured (broker, llmproxy, agent-login, audit)', async (t) => {
  const lines = [
    ...printed,
    ...h.logs,
    ...proxy.logs.map((l) => JSON.stringify(l)),
    JSON.stringify(h.audit),
    JSON.stringify(proxy.audit),
    JSON.stringify(cph.audit),
  ].join('\n');
  t.ok(secrets.size > 10, `${secrets.size} tokens and values checked`);
  t.same([...secrets].filter((s) => lines.includes(s)).length, 0, 'none of them appears');
});
