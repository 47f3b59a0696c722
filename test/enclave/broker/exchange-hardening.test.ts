import t, { type Test as Tap } from 'tap';
import { readFile, rm } from 'node:fs/promises';
import Fastify, { type FastifyInstance } from 'fastify';
import { Agent, request } from 'undici';
import { problems } from '../../../core/problems-plugin.ts';
import { VALIDATION } from '../../../core/schema-errors.ts';
import type { Db } from '../../../core/sql.ts';
import { getAgent } from '../../../enclave/broker/agents.ts';
import { agentRoutes } from '../../../enclave/broker/agent-routes.ts';
import { issueBootstrapToken } from '../../../enclave/broker/bootstrap-tokens.ts';
import { EnclaveCa } from '../../../enclave/broker/identity/enclave-ca.ts';
import { SigningKeys } from '../../../enclave/broker/identity/signing-keys.ts';
import { until } from '../../fixtures/eventually.ts';
import { tlsDir } from '../../fixtures/tls-dir.ts';
import {
  addAgent,
  brokerStore,
  testAgentView,
  testClock,
  testDeps,
  type TestDeps,
  type TestStore,
} from './identity-fixture.ts';

// The agent listener attacked at its edges, on real TLS over a real store (PGlite and PostgreSQL): a
// config value nested past any depth a config holds, exchanges racing an operator's suspension or
// isolation committed from another connection, the tables of spent tokens pruned, and a store that
// stops answering while a JWT is verified.

const tlsFiles = await tlsDir('dvx-exchange-hardening-');
t.teardown(() => tlsFiles.remove());
const dispatcher = new Agent({ connect: { ca: tlsFiles.ca.certPem } });
t.teardown(() => dispatcher.close());

interface Answer {
  status: number;
  type: string;
  body: any;
}

interface Broker {
  deps: TestDeps;
  keys: SigningKeys;
  app: FastifyInstance;
  clock: ReturnType<typeof testClock>;
  call(method: string, path: string, opts?: { body?: unknown; raw?: string; jwt?: string }): Promise<Answer>;
  token(uid: string): Promise<string>;
}

async function startBroker(db: Db, pruneEveryMs?: number): Promise<Broker> {
  const clock = testClock();
  const deps = testDeps(db, {}, clock);
  const keys = await SigningKeys.open(deps, { checkEveryMs: 0 });
  const ca = await EnclaveCa.load({ cert: `${tlsFiles.dir}/enclave-ca.pem`, key: `${tlsFiles.dir}/enclave-ca.key` });
  const app = Fastify({
    https: { cert: await readFile(tlsFiles.cert), key: await readFile(tlsFiles.key) },
    logger: false,
    bodyLimit: 1024 * 1024,
    ...VALIDATION,
  });
  await app.register(problems, { log: deps.log, component: 'broker' });
  await app.register(
    agentRoutes(deps, { keys, ca, view: testAgentView(db, deps.sealer) }, pruneEveryMs ? { pruneEveryMs } : {}),
  );
  await app.listen({ port: 0, host: '127.0.0.1' });
  const port = (app.server.address() as { port: number }).port;
  return {
    deps,
    keys,
    app,
    clock,
    async call(method, path, opts = {}) {
      const headers: Record<string, string> = {};
      let body: string | undefined;
      if (opts.raw !== undefined || opts.body !== undefined) {
        headers['content-type'] = 'application/json';
        body = opts.raw ?? JSON.stringify(opts.body);
      }
      if (opts.jwt) headers.authorization = `Bearer ${opts.jwt}`;
      const res = await request(`https://127.0.0.1:${port}${path}`, {
        method: method as 'GET',
        headers,
        body,
        dispatcher,
      });
      const text = await res.body.text();
      let parsed: unknown = text;
      try {
        parsed = JSON.parse(text);
      } catch {
        // not JSON: kept as text for the assertion to show
      }
      return { status: res.statusCode, type: String(res.headers['content-type'] ?? ''), body: parsed };
    },
    token: (uid) => db.transaction((tx) => issueBootstrapToken(tx, uid, 3600_000, clock.now())),
  };
}

const problem = (t: Tap, a: Answer, status: number) => {
  t.equal(a.status, status, `${status}: ${JSON.stringify(a.body).slice(0, 200)}`);
  t.match(a.type, /^application\/problem\+json/, 'a Problem document');
};

async function openStore(t: Tap, kind: 'pglite' | 'postgres'): Promise<TestStore | null> {
  const store = await brokerStore(kind);
  if (!store) {
    if (process.env.CI) t.fail('PostgreSQL is not reachable on 127.0.0.1:5432');
    else t.comment('PostgreSQL is not reachable on 127.0.0.1:5432: skipped');
    return null;
  }
  t.teardown(() => store.close());
  return store;
}

async function stop(b: Broker) {
  b.keys.close();
  await b.app.close();
}

for (const kind of ['pglite', 'postgres'] as const) {
  t.test(`${kind}: a config value nested deeper than any config is 400, not 500`, async (t) => {
    const store = await openStore(t, kind);
    if (!store) return;
    const b = await startBroker(store.db);
    t.teardown(() => stop(b));
    await addAgent(store.db, { uid: 'deep-1', org_id: 'org-a' });
    const boot = await b.call('POST', '/v1/agent/bootstrap', { body: { token: await b.token('deep-1') } });
    t.equal(boot.status, 200);
    const depth = 100_000;
    const raw = `{"value":${'['.repeat(depth)}${']'.repeat(depth)}}`;
    const a = await b.call('PUT', '/v1/agent/config/deep.key', { raw, jwt: boot.body.jwt });
    problem(t, a, 400);
    t.match(a.body.detail, /value: .*nested/);
    const shallow = await b.call('PUT', '/v1/agent/config/deep.key', {
      body: { value: { a: [{ b: [1, 2, { c: 'x' }] }] } },
      jwt: boot.body.jwt,
    });
    t.equal(shallow.status, 200, 'an ordinary nested value is taken');
    t.same(shallow.body.config['deep.key'], { a: [{ b: [1, 2, { c: 'x' }] }] });
    t.notMatch(b.deps.logText(), /request failed/, 'nothing failed on the way');
  });

  t.test(`${kind}: spent tokens and dead families are pruned`, async (t) => {
    const store = await openStore(t, kind);
    if (!store) return;
    const db = store.db;
    const b = await startBroker(db, 50);
    t.teardown(() => stop(b));
    await addAgent(db, { uid: 'prune-1', org_id: 'org-a' });
    const boot = await b.call('POST', '/v1/agent/bootstrap', { body: { token: await b.token('prune-1') } });
    t.equal(boot.status, 200);
    let refresh = boot.body.refresh_token as string;
    for (let i = 0; i < 3; i++) {
      const r = await b.call('POST', '/v1/agent/refresh', { body: { refresh_token: refresh } });
      t.equal(r.status, 200);
      refresh = r.body.refresh_token;
    }
    const count = async (table: string) => Number((await db.query(`SELECT count(*) AS n FROM ${table}`)).rows[0].n);
    t.equal(await count('broker_refresh_tokens'), 4, 'the used tokens are kept while a replay could come');

    // Past --refresh-ttl the used tokens are gone, the live one stays... and then it expires too.
    b.clock.advance(b.deps.options.refreshTtl - 1000);
    const r = await b.call('POST', '/v1/agent/refresh', { body: { refresh_token: refresh } });
    t.equal(r.status, 200);
    b.clock.advance(2000);
    t.ok(await until(async () => (await count('broker_refresh_tokens')) === 1), 'the expired tokens are pruned');
    t.equal(await count('broker_bootstrap_tokens'), 0, 'the used bootstrap token is pruned');
    t.equal(await count('broker_token_families'), 1, 'the family with a live token stays');
    b.clock.advance(b.deps.options.refreshTtl);
    t.ok(await until(async () => (await count('broker_token_families')) === 0), 'a family without tokens is pruned');
    t.equal(await count('broker_refresh_tokens'), 0);
  });
}

t.test('postgres: an exchange racing an operator suspension or isolation never undoes it', async (t) => {
  const store = await openStore(t, 'postgres');
  if (!store) return;
  const other = (await store.second())!;
  const b = await startBroker(store.db);
  t.teardown(() => stop(b));
  const db = store.db;

  /** Holds the agent's row changed to `status` in another transaction until the exchange waits on it. */
  const operatorChange = async (uid: string, status: string, exchange: () => Promise<Answer>) => {
    let answer!: Promise<Answer>;
    await other.transaction(async (tx) => {
      await tx.query(`UPDATE broker_agents SET status = $2, reason = 'operator' WHERE uid = $1`, [uid, status]);
      answer = exchange();
      const waiting = await until(async () => {
        const { rows } = await db.query(
          `SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`,
        );
        return rows.length > 0;
      }, 10_000);
      t.ok(waiting, 'the exchange waits on the agent row');
    });
    return answer;
  };

  t.test('a bootstrap that meets a suspension is refused and spends nothing', async (t) => {
    await addAgent(db, { uid: 'race-1', org_id: 'org-a' });
    const token = await b.token('race-1');
    const a = await operatorChange('race-1', 'suspended', () =>
      b.call('POST', '/v1/agent/bootstrap', { body: { token } }),
    );
    problem(t, a, 403);
    t.match(await getAgent(db, 'race-1'), { status: 'suspended', reason: 'operator' }, "the operator's state stands");
    const families = await db.query('SELECT 1 FROM broker_token_families WHERE agent_uid = $1', ['race-1']);
    t.equal(families.rows.length, 0, 'no identity was started');
    const live = await db.query('SELECT 1 FROM broker_bootstrap_tokens WHERE agent_uid = $1 AND used_at IS NULL', [
      'race-1',
    ]);
    t.equal(live.rows.length, 1, 'the token stays usable for after a restore');
  });

  t.test('a replay that meets an isolation leaves the agent isolated', async (t) => {
    await addAgent(db, { uid: 'race-2', org_id: 'org-a' });
    const boot = await b.call('POST', '/v1/agent/bootstrap', { body: { token: await b.token('race-2') } });
    t.equal(boot.status, 200);
    const used = boot.body.refresh_token;
    t.equal((await b.call('POST', '/v1/agent/refresh', { body: { refresh_token: used } })).status, 200);
    const a = await operatorChange('race-2', 'isolated', () =>
      b.call('POST', '/v1/agent/refresh', { body: { refresh_token: used } }),
    );
    problem(t, a, 409);
    t.match(await getAgent(db, 'race-2'), { status: 'isolated', reason: 'operator' }, 'isolated, not suspended');
  });
});

t.test('pglite: a store that stops answering is not an agent credential refused', async (t) => {
  const store = (await brokerStore('pglite'))!;
  // The store is closed by the test: only its directory is left to remove.
  t.teardown(() => rm(store.dsn.slice('pglite://'.length), { recursive: true, force: true }));
  const b = await startBroker(store.db);
  t.teardown(() => stop(b));
  await addAgent(store.db, { uid: 'down-1', org_id: 'org-a' });
  const boot = await b.call('POST', '/v1/agent/bootstrap', { body: { token: await b.token('down-1') } });
  t.equal(boot.status, 200);
  b.clock.advance(10_000); // past the keys' cache: the next verification reads the store
  await store.db.close();
  const a = await b.call('GET', '/v1/agent/config', { jwt: boot.body.jwt });
  t.ok(a.status >= 500, `a server error, not a refused credential: ${a.status}`);
  t.match(a.type, /^application\/problem\+json/);
});
