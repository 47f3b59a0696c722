import t from 'tap';
import { spawn } from 'node:child_process';
import { X509Certificate, createPrivateKey, createPublicKey } from 'node:crypto';
import { mkdir, mkdtemp, readdir, readFile, rm, stat, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { decodeJwt } from 'jose';
import { createLogger } from '../../core/logger.ts';
import { AgentLogin, renewalDelay, safeSecretName } from '../../enclave/agent-login.ts';
import { issueBootstrapToken } from '../../enclave/broker/bootstrap-tokens.ts';
import { getAgent, setStatus } from '../../enclave/broker/agents.ts';
import { AgentLoginRefusedError, AgentLoginUnavailableError } from '../../enclave/errors.ts';
import { startBrokerHarness } from '../fixtures/broker-harness.ts';
import { until } from '../fixtures/eventually.ts';
import { DVX_BIN, runDvx } from '../fixtures/run-dvx.ts';
import { startTcpProxy } from '../fixtures/tcp-proxy.ts';

// dvx agent-login against a real broker over TLS: the bootstrap, the files it keeps (modes, contents,
// secrets that come and go, names that are not safe file names), renewal in a loop, restarts that resume
// the family, refusals (replay, suspension) that stop it with exit 4, an unreachable broker (retried until
// the JWT would expire; exit 3 with --once), SIGTERM, the lock on DIR, and the CSR. Nothing it prints
// holds a token or a secret value.

const h = await startBrokerHarness();
t.teardown(() => h.close());
const db = h.broker.deps.db;
const brokerUrl = () => `https://127.0.0.1:${h.broker.agentPort}`;
const caFile = join(h.dir, 'broker-ca.pem');
await writeFile(caFile, h.tls.ca.certPem);

const DB_PASSWORD = 'pw-7f3a9c1e-never-printed';
const API_TOKEN = 'tok-51b2e8d0-never-printed';

let n = 0;
/** A fresh agent known to the broker, its bootstrap token in a file, and an output directory. */
async function agent(status = 'provisioning') {
  const uid = `bot-${++n}`;
  await db.query('INSERT INTO broker_agents (uid, org_id, group_id, name, status) VALUES ($1, $2, $3, $4, $5)', [
    uid,
    'org-1',
    'g-1',
    `builder-${n}`,
    status,
  ]);
  const dir = await mkdtemp(join(tmpdir(), 'dvx-agent-login-'));
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  const tokenFile = join(dir, 'bootstrap-token');
  const token = await issueBootstrapToken(db, uid, 3600_000, Date.now());
  await writeFile(tokenFile, `${token}\n`, { mode: 0o600 });
  return { uid, dir, tokenFile, out: join(dir, 'out'), token };
}

/** A secret written as the broker's secret store writes one (sealed; the version bumped; satellites told). */
async function putSecret(scope: 'org' | 'agent', scopeId: string, name: string, value: string) {
  await db.query(
    `INSERT INTO broker_secrets (scope_kind, org_id, scope_id, name, sealed) VALUES ($1, 'org-1', $2, $3, $4)
     ON CONFLICT (scope_kind, org_id, scope_id, name) DO UPDATE SET sealed = EXCLUDED.sealed, updated_at = now()`,
    [scope, scopeId, name, await h.broker.deps.sealer.seal(value)],
  );
  const { rows } = await db.query<{ version: string }>(
    'UPDATE broker_secrets_version SET version = version + 1 RETURNING version',
  );
  h.broker.deps.bus.emit('secrets', Number(rows[0]!.version));
}
async function deleteSecret(scope: 'org' | 'agent', scopeId: string, name: string) {
  await db.query('DELETE FROM broker_secrets WHERE scope_kind = $1 AND scope_id = $2 AND name = $3', [
    scope,
    scopeId,
    name,
  ]);
  const { rows } = await db.query<{ version: string }>(
    'UPDATE broker_secrets_version SET version = version + 1 RETURNING version',
  );
  h.broker.deps.bus.emit('secrets', Number(rows[0]!.version));
}

const args = (a: { tokenFile: string; out: string; broker?: string }, ...more: string[]) => [
  'agent-login',
  '--broker',
  a.broker ?? brokerUrl(),
  '--token-file',
  a.tokenFile,
  '--out',
  a.out,
  '--ca-cert',
  caFile,
  ...more,
];

/** An in-process run with its log lines kept. */
function login(
  a: { tokenFile: string; out: string },
  options: Partial<ConstructorParameters<typeof AgentLogin>[0]> = {},
) {
  const lines: string[] = [];
  const log = createLogger({
    level: 'debug',
    destination: new Writable({
      write(chunk, _e, cb) {
        lines.push(String(chunk));
        cb();
      },
    }) as never,
  });
  const stop = new AbortController();
  const run = new AgentLogin({
    broker: brokerUrl(),
    tokenFile: a.tokenFile,
    out: a.out,
    ca: Buffer.from(h.tls.ca.certPem),
    log,
    signal: stop.signal,
    backoffMinMs: 20,
    backoffMaxMs: 100,
    ...options,
  });
  return { run, lines, stop };
}

const mode = async (path: string) => (await stat(path)).mode & 0o777;
const read = (path: string) => readFile(path, 'utf8');
const printed: string[] = [];
const tokens: string[] = [];

t.test('the pure parts: renewal timing and safe secret names', async (t) => {
  t.equal(renewalDelay(300_000, 240_000, 300_000, 0), 240_000, 'the window opens at 4 minutes');
  t.equal(renewalDelay(300_000, 240_000, 300_000, 1), 240_000, 'a 5-minute JWT: 80% of it comes first');
  t.equal(renewalDelay(3_600_000, 240_000, 300_000, 0.5), 270_000, 'a long JWT: a random instant in the window');
  t.equal(renewalDelay(60_000, 240_000, 300_000, 0.5), 48_000, 'a short JWT: at 80% of its lifetime');
  for (const ok of ['db_password', 'API-KEY.v2', 'a b', 'ключ', 'x'.repeat(255)]) t.ok(safeSecretName(ok), ok);
  for (const bad of ['', '.', '..', '.hidden', '../escape', 'a/b', 'a\\b', 'nul\u0000', 'line\nbreak', 'x'.repeat(256)])
    t.notOk(safeSecretName(bad), JSON.stringify(bad));
});

t.test('usage and input errors exit 2 with a message naming the problem', async (t) => {
  const a = await agent();
  const missing = await runDvx(['agent-login', '--broker', brokerUrl(), '--out', a.out]);
  t.equal(missing.code, 2);
  t.match(missing.stderr, /--token-file is required/);
  const noFile = await runDvx(args({ tokenFile: join(a.dir, 'absent'), out: a.out }, '--once'));
  t.equal(noFile.code, 2);
  t.match(noFile.stderr, /--token-file .*absent does not exist/);
  await writeFile(join(a.dir, 'empty'), '  \n');
  const empty = await runDvx(args({ tokenFile: join(a.dir, 'empty'), out: a.out }, '--once'));
  t.equal(empty.code, 2);
  t.match(empty.stderr, /is empty/);
  const plain = await runDvx([
    'agent-login',
    '--broker',
    'http://127.0.0.1:1',
    '--token-file',
    a.tokenFile,
    '--out',
    a.out,
  ]);
  t.equal(plain.code, 2);
  t.match(plain.stderr, /https URL/);
  const env = await runDvx(['agent-login', '--once'], {
    env: { DVX_BROKER: brokerUrl(), DVX_TOKEN_FILE: join(a.dir, 'absent'), DVX_OUT: a.out, DVX_CA_CERT: caFile },
  });
  t.equal(env.code, 2, 'every flag reads DVX_*');
  t.match(env.stderr, /absent does not exist/);
  await writeFile(join(a.dir, 'huge'), 'x'.repeat(70_000));
  await t.rejects(login({ tokenFile: join(a.dir, 'huge'), out: a.out }, { once: true }).run.run(), {
    name: 'AgentLoginInputError',
    message: /larger than 65536 bytes: not a token file/,
  });
  await writeFile(join(a.dir, 'two'), 'dvxb_one\ndvxb_two\n');
  await t.rejects(login({ tokenFile: join(a.dir, 'two'), out: a.out }, { once: true }).run.run(), {
    name: 'AgentLoginInputError',
    message: /does not hold one bootstrap token/,
  });
  t.equal((await getAgent(db, a.uid))!.status, 'provisioning', 'nothing was exchanged');
});

t.test('--once bootstraps: the files, their modes and contents; a second --once refreshes', async (t) => {
  const a = await agent();
  tokens.push(a.token);
  await putSecret('agent', a.uid, 'db_password', DB_PASSWORD);
  await putSecret('org', 'org-1', 'api_token', API_TOKEN);
  await putSecret('org', 'org-1', 'llmproxy:llm.api_key', 'sk-satellite-only-never-served');
  await putSecret('agent', a.uid, '.hidden', 'x');
  await putSecret('agent', a.uid, '..', 'y');

  const first = await runDvx(args(a, '--once'));
  printed.push(first.stdout, first.stderr);
  t.equal(first.code, 0, first.stderr);
  t.equal(await mode(a.out), 0o700);
  t.equal(await mode(join(a.out, 'secrets')), 0o700);
  for (const f of ['jwt', 'refresh-token', 'config.json', 'identity.json', 'secrets/db_password', 'secrets/api_token'])
    t.equal(await mode(join(a.out, f)), 0o600, `${f} is 0600`);
  const jwt = await read(join(a.out, 'jwt'));
  tokens.push(jwt);
  t.match(jwt, /^[\w-]+\.[\w-]+\.[\w-]+$/, 'the JWT alone, no newline');
  t.match(decodeJwt(jwt), { sub: a.uid, org_id: 'org-1', group_id: 'g-1' });
  const refresh1 = await read(join(a.out, 'refresh-token'));
  tokens.push(refresh1);
  t.same(JSON.parse(await read(join(a.out, 'identity.json'))), {
    agent_id: a.uid,
    org_id: 'org-1',
    agent_name: `builder-${n}`,
  });
  t.match(JSON.parse(await read(join(a.out, 'config.json'))), { config: {}, config_hash: /^\w+$/ });
  t.equal(await read(join(a.out, 'secrets/db_password')), DB_PASSWORD);
  t.equal(await read(join(a.out, 'secrets/api_token')), API_TOKEN);
  t.same(
    (await readdir(join(a.out, 'secrets'))).sort(),
    ['api_token', 'db_password'],
    'no satellite secret, no unsafe name',
  );
  t.match(first.stdout, /a secret name is not a safe file name/, 'the unsafe names are logged');
  t.match(first.stdout, /agent bootstrapped/);
  t.equal((await getAgent(db, a.uid))!.status, 'active');
  t.notOk((await readdir(a.out)).includes('.lock'), 'the lock is released');

  // The bootstrap token is single use: a run resumes with the refresh token instead.
  await deleteSecret('org', 'org-1', 'api_token');
  const second = await runDvx(args(a, '--once'));
  printed.push(second.stdout, second.stderr);
  t.equal(second.code, 0, second.stderr);
  t.match(second.stdout, /agent identity renewed/);
  const refresh2 = await read(join(a.out, 'refresh-token'));
  tokens.push(refresh2, await read(join(a.out, 'jwt')));
  t.not(refresh2, refresh1, 'the refresh token rotated');
  t.not(await read(join(a.out, 'jwt')), jwt, 'a new JWT');
  t.same(await readdir(join(a.out, 'secrets')), ['db_password'], 'a secret no longer served is removed');
});

t.test('a replayed refresh token: 409 and the family dead; agent-login stops with exit 4', async (t) => {
  const a = await agent();
  tokens.push(a.token);
  t.equal((await runDvx(args(a, '--once'))).code, 0);
  const stolen = await read(join(a.out, 'refresh-token'));
  tokens.push(stolen);
  const renewed = await runDvx(args(a, '--once'));
  t.equal(renewed.code, 0);
  // Someone replays the token agent-login already spent.
  const replay = await h.agent('POST', '/v1/agent/refresh', { refresh_token: stolen });
  t.equal(replay.status, 409);
  t.equal((await getAgent(db, a.uid))!.status, 'suspended');
  const after = await runDvx(args(a, '--once'));
  printed.push(after.stdout, after.stderr);
  t.equal(after.code, 4, 'refused for good');
  t.match(after.stderr, /^dvx: the broker refused \/v1\/agent\/refresh \(401/m);

  // An operator restores the agent and it is provisioned again: the new bootstrap token is redeemed.
  await setStatus(db, a.uid, 'provisioning', null);
  const fresh = await issueBootstrapToken(db, a.uid, 3600_000, Date.now());
  tokens.push(fresh);
  await writeFile(a.tokenFile, fresh);
  const again = await runDvx(args(a, '--once'));
  printed.push(again.stdout, again.stderr);
  t.equal(again.code, 0, again.stderr);
  t.match(again.stdout, /redeeming the new bootstrap token/);
  t.match(again.stdout, /agent bootstrapped/);
  t.equal((await getAgent(db, a.uid))!.status, 'active');
  // A bootstrap token is never presented twice: with the new family dead too, nothing is left to try.
  const current = await read(join(a.out, 'refresh-token'));
  tokens.push(current);
  t.equal((await h.agent('POST', '/v1/agent/refresh', { refresh_token: current })).status, 200);
  t.equal((await h.agent('POST', '/v1/agent/refresh', { refresh_token: current })).status, 409, 'replayed');
  const dead = await runDvx(args(a, '--once'));
  printed.push(dead.stdout, dead.stderr);
  t.equal(dead.code, 4);
  t.match(dead.stderr, /401/);
});

t.test(
  'the new refresh token is on disk before the other files: a run that fails writing them loses nothing',
  async (t) => {
    const a = await agent();
    tokens.push(a.token);
    await putSecret('agent', a.uid, 'blocked', 'v');
    t.equal((await runDvx(args(a, '--once'))).code, 0);
    const spent = await read(join(a.out, 'refresh-token'));
    tokens.push(spent);
    // The secret's file cannot be replaced (a non-empty directory stands in its place): the run fails midway.
    await rm(join(a.out, 'secrets', 'blocked'));
    await mkdir(join(a.out, 'secrets', 'blocked'));
    await writeFile(join(a.out, 'secrets', 'blocked', 'x'), '');
    await t.rejects(login(a, { once: true }).run.run(), {
      name: 'AgentLoginInputError',
      message: /cannot write the agent's files under/,
    });
    const next = await read(join(a.out, 'refresh-token'));
    tokens.push(next);
    t.not(next, spent, 'the rotated token was persisted although the run failed');
    await rm(join(a.out, 'secrets', 'blocked'), { recursive: true });
    const { run } = login(a, { once: true });
    t.ok(await run.run(), 'the next run renews: no replay');
    t.equal((await getAgent(db, a.uid))!.status, 'active');
    t.equal(await read(join(a.out, 'secrets', 'blocked')), 'v');
  },
);

t.test('a suspended agent: 403, exit 4; restored, the same family renews again', async (t) => {
  const a = await agent();
  tokens.push(a.token);
  t.equal((await runDvx(args(a, '--once'))).code, 0);
  await setStatus(db, a.uid, 'suspended', 'operator');
  const refused = await runDvx(args(a, '--once'));
  printed.push(refused.stdout, refused.stderr);
  t.equal(refused.code, 4);
  t.match(refused.stderr, /403, the agent is refused/);
  await setStatus(db, a.uid, 'active', null);
  t.equal((await runDvx(args(a, '--once'))).code, 0, 'the refusal did not spend the refresh token');
});

t.test('the renewal loop rewrites the files; a stop ends it cleanly', async (t) => {
  const a = await agent();
  tokens.push(a.token);
  await putSecret('agent', a.uid, 'rotating', 'v1-value');
  const { run, lines, stop } = login(a, { renewMinMs: 100, renewMaxMs: 150 });
  const done = run.run();
  t.ok(await until(() => (run.state?.exchanges ?? 0) >= 2), 'renewed');
  await putSecret('agent', a.uid, 'rotating', 'v2-value');
  t.ok(await until(async () => (await read(join(a.out, 'secrets/rotating'))) === 'v2-value'), 'a changed secret');
  await deleteSecret('agent', a.uid, 'rotating');
  t.ok(await until(async () => (await readdir(join(a.out, 'secrets'))).length === 0), 'a removed secret');
  const count = run.state!.exchanges;
  stop.abort();
  const state = await done;
  t.ok(state!.exchanges >= count);
  t.equal(state!.agentId, a.uid);
  printed.push(lines.join(''));
  t.match(lines.join(''), /agent identity renewed/);
  t.notOk((await readdir(a.out)).includes('.lock'), 'the lock is released');
});

t.test('two agent-logins on one DIR: the second is refused', async (t) => {
  const a = await agent();
  tokens.push(a.token);
  const { run, stop } = login(a, { renewMinMs: 60_000, renewMaxMs: 60_000 });
  const done = run.run();
  t.ok(await until(() => run.state !== null));
  const second = await runDvx(args(a, '--once'));
  t.equal(second.code, 2);
  t.match(second.stderr, /another dvx agent-login \(pid \d+\) is using/);
  stop.abort();
  await done;
  // A lock left by a process that is gone is taken over.
  await writeFile(join(a.out, '.lock'), '999999999');
  t.equal((await runDvx(args(a, '--once'))).code, 0);
});

t.test(
  'an unreachable broker: --once exits 3; the loop retries and resumes, or gives up once the JWT expired',
  async (t) => {
    const a = await agent();
    tokens.push(a.token);
    const relay = await startTcpProxy(h.broker.agentPort);
    t.teardown(() => relay.close());
    const via = `https://127.0.0.1:${relay.port}`;
    await relay.cut();
    const once = await runDvx(args({ ...a, broker: via }, '--once'));
    printed.push(once.stdout, once.stderr);
    t.equal(once.code, 3);
    t.match(once.stderr, /cannot reach the broker at https:\/\/127\.0\.0\.1:\d+\/v1\/agent\/bootstrap: ECONNREFUSED/);

    await relay.restore();
    let clock = Date.now();
    const { run, lines, stop } = login(a, { broker: via, renewMinMs: 50, renewMaxMs: 60, now: () => clock });
    const done = run.run();
    t.ok(await until(() => run.state !== null), 'bootstrapped through the relay');
    await relay.cut();
    t.ok(await until(() => /exchange with the broker failed; retrying/.test(lines.join(''))), 'retrying');
    const before = run.state!.exchanges;
    await relay.restore();
    t.ok(await until(() => run.state!.exchanges > before), 'renewed once the broker is back');
    await relay.cut();
    t.ok(await until(() => lines.join('').split('retrying').length > 3));
    clock += 10 * 60_000; // the JWT would have expired by now
    await t.rejects(done, AgentLoginUnavailableError, 'gives up once the JWT expired');
    t.match(lines.join(''), /retry_in_ms/);
    stop.abort();
    printed.push(lines.join(''));
  },
);

t.test('SIGTERM stops a running agent-login cleanly (exit 0)', async (t) => {
  const a = await agent();
  tokens.push(a.token);
  const child = spawn(DVX_BIN, args(a), { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  child.stdout.on('data', (d) => (out += d));
  child.stderr.on('data', (d) => (out += d));
  const exited = new Promise<number | null>((resolve) => child.on('close', (code) => resolve(code)));
  t.ok(await until(() => /agent bootstrapped/.test(out)), 'bootstrapped');
  child.kill('SIGTERM');
  t.equal(await exited, 0);
  t.match(out, /stopping/);
  printed.push(out);
  t.notOk((await readdir(a.out)).includes('.lock'));
});

t.test('--csr: a P-256 key made under DIR, a 5-minute certificate naming the agent', async (t) => {
  const a = await agent();
  tokens.push(a.token);
  const r = await runDvx(args(a, '--once', '--csr'));
  printed.push(r.stdout, r.stderr);
  t.equal(r.code, 0, r.stderr);
  t.equal(await mode(join(a.out, 'key.pem')), 0o600);
  t.equal(await mode(join(a.out, 'cert.pem')), 0o600);
  const key = createPrivateKey(await read(join(a.out, 'key.pem')));
  t.equal(key.asymmetricKeyDetails?.namedCurve, 'prime256v1');
  const cert = new X509Certificate(await read(join(a.out, 'cert.pem')));
  t.match(cert.subject, new RegExp(`CN=${a.uid}`));
  t.match(cert.subject, /O=org-1/);
  t.ok(cert.publicKey.equals(createPublicKey(key)), "the certificate is for agent-login's own key");
  t.ok(Date.parse(cert.validTo) - Date.now() <= 6 * 60_000, 'short-lived');
  const keyPem = await read(join(a.out, 'key.pem'));
  t.notOk(h.logs.join('').includes(keyPem.split('\n')[1]!), 'the key never reached the broker');
  const renewed = await runDvx(args(a, '--once', '--csr'));
  t.equal(renewed.code, 0);
  t.ok(
    new X509Certificate(await read(join(a.out, 'cert.pem'))).publicKey.equals(createPublicKey(key)),
    'renewal keeps the key',
  );
});

t.test('a symlink planted as DIR/secrets is refused: nothing written or removed where it points', async (t) => {
  const a = await agent();
  tokens.push(a.token);
  await putSecret('agent', a.uid, 'db_password', DB_PASSWORD);
  const elsewhere = join(a.dir, 'elsewhere');
  await mkdir(elsewhere, { mode: 0o755 });
  await writeFile(join(elsewhere, 'precious'), 'keep me');
  await mkdir(a.out, { mode: 0o700 });
  await symlink(elsewhere, join(a.out, 'secrets'));
  const { run } = login(a, { once: true });
  await t.rejects(run.run(), { name: 'AgentLoginInputError', message: /secrets/ });
  t.same(await readdir(elsewhere), ['precious'], 'nothing removed, no secret written through the link');
  t.equal(await read(join(elsewhere, 'precious')), 'keep me');
  t.equal(await mode(elsewhere), 0o755, 'its mode untouched');
  t.equal((await getAgent(db, a.uid))!.status, 'provisioning', 'refused before any exchange');
});

t.test('refusals in-process are typed: AgentLoginRefusedError with the status', async (t) => {
  const a = await agent('suspended');
  tokens.push(a.token);
  const { run } = login(a);
  const err = await run.run().catch((e: unknown) => e);
  t.ok(err instanceof AgentLoginRefusedError);
  t.equal((err as AgentLoginRefusedError).status, 403);
});

t.test('no token or secret value reached a line any run printed, nor the broker log', async (t) => {
  const all = printed.join('\n') + h.logs.join('');
  t.ok(printed.length > 10 && tokens.length > 10);
  t.same([DB_PASSWORD, API_TOKEN, ...tokens].filter((s) => all.includes(s)).length, 0);
});
