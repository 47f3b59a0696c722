import 'reflect-metadata';
import t, { type Test as Tap } from 'tap';
import { createPrivateKey, webcrypto, X509Certificate } from 'node:crypto';
import { readFile } from 'node:fs/promises';
import Fastify, { type FastifyInstance } from 'fastify';
import { createLocalJWKSet, decodeProtectedHeader, generateKeyPair, jwtVerify, SignJWT } from 'jose';
import { Agent, request } from 'undici';
import * as x509 from '@peculiar/x509';
import { problems } from '../../../core/problems-plugin.ts';
import { VALIDATION } from '../../../core/schema-errors.ts';
import { changeStatus, getAgent } from '../../../enclave/broker/agents.ts';
import { agentRoutes } from '../../../enclave/broker/agent-routes.ts';
import { issueBootstrapToken } from '../../../enclave/broker/bootstrap-tokens.ts';
import { EnclaveCa } from '../../../enclave/broker/identity/enclave-ca.ts';
import { SigningKeys } from '../../../enclave/broker/identity/signing-keys.ts';
import { tlsDir } from '../../fixtures/tls-dir.ts';
import {
  addAgent,
  brokerStore,
  putSecret,
  testAgentView,
  testClock,
  testDeps,
  type TestDeps,
  type TestStore,
} from './identity-fixture.ts';

// The agent listener's routes on a real TLS fastify server over a real store (PGlite and PostgreSQL):
// bootstrap and renewal exchanges, the replay of a refresh token, refused agents, the JWT-guarded
// secrets and config routes, and every kind of bad input answered as a 4xx Problem.

const tlsFiles = await tlsDir('dvx-agent-routes-');
t.teardown(() => tlsFiles.remove());
const dispatcher = new Agent({ connect: { ca: tlsFiles.ca.certPem } });
t.teardown(() => dispatcher.close());
const P256 = { name: 'ECDSA', namedCurve: 'P-256', hash: 'SHA-256' } as const;
const ORG_KEY = 'sk-org-secret-7f3a';
const AGENT_KEY = 'sk-agent-override-91bc';

interface Answer {
  status: number;
  type: string;
  body: any;
  headers: Record<string, unknown>;
}

async function newCsr(): Promise<{ csr: string; keyPem: string }> {
  const keys = (await webcrypto.subtle.generateKey(P256, true, ['sign', 'verify'])) as webcrypto.CryptoKeyPair;
  const csr = await x509.Pkcs10CertificateRequestGenerator.create({
    name: 'CN=whoever',
    keys: keys as never,
    signingAlgorithm: P256,
  });
  const der = Buffer.from(await webcrypto.subtle.exportKey('pkcs8', keys.privateKey));
  return {
    csr: csr.toString('pem'),
    keyPem: String(
      createPrivateKey({ key: der, format: 'der', type: 'pkcs8' }).export({ format: 'pem', type: 'pkcs8' }),
    ),
  };
}

interface Broker {
  store: TestStore;
  deps: TestDeps;
  keys: SigningKeys;
  app: FastifyInstance;
  clock: ReturnType<typeof testClock>;
  call(
    method: string,
    path: string,
    opts?: { body?: unknown; raw?: string; type?: string; jwt?: string },
  ): Promise<Answer>;
  token(uid: string): Promise<string>;
  secretsSeen: string[];
}

async function startBroker(store: TestStore): Promise<Broker> {
  const clock = testClock();
  const deps = testDeps(store.db, {}, clock);
  const keys = await SigningKeys.open(deps, { checkEveryMs: 0 });
  const ca = await EnclaveCa.load({ cert: `${tlsFiles.dir}/enclave-ca.pem`, key: `${tlsFiles.dir}/enclave-ca.key` });
  const view = testAgentView(store.db, deps.sealer, { 'llmproxy.credential_mode': 'platform' }, [
    'llmproxy.downstream_url',
  ]);
  const app = Fastify({
    https: { cert: await readFile(tlsFiles.cert), key: await readFile(tlsFiles.key) },
    logger: false,
    bodyLimit: 1024 * 1024,
    ...VALIDATION,
  });
  await app.register(problems, { log: deps.log, component: 'broker' });
  await app.register(agentRoutes(deps, { keys, ca, view }));
  await app.listen({ port: 0, host: '127.0.0.1' });
  const port = (app.server.address() as { port: number }).port;
  return {
    store,
    deps,
    keys,
    app,
    clock,
    secretsSeen: [ORG_KEY, AGENT_KEY],
    async call(method, path, opts = {}) {
      const headers: Record<string, string> = {};
      let body: string | undefined;
      if (opts.raw !== undefined || opts.body !== undefined) {
        headers['content-type'] = opts.type ?? 'application/json';
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
      return {
        status: res.statusCode,
        type: String(res.headers['content-type'] ?? ''),
        body: parsed,
        headers: res.headers,
      };
    },
    token: (uid) => store.db.transaction((tx) => issueBootstrapToken(tx, uid, 3600_000, clock.now())),
  };
}

for (const kind of ['pglite', 'postgres'] as const) {
  t.test(kind, async (t) => {
    const store = await brokerStore(kind);
    if (!store) {
      if (process.env.CI) t.fail('PostgreSQL is not reachable on 127.0.0.1:5432');
      else t.comment('PostgreSQL is not reachable on 127.0.0.1:5432: skipped');
      return;
    }
    t.teardown(() => store.close());
    const b = await startBroker(store);
    t.teardown(async () => {
      b.keys.close();
      await b.app.close();
    });
    const db = store.db;
    await addAgent(db, { uid: 'bot-1', org_id: 'org-a', group_id: 'ops', name: 'builder' });
    await putSecret(db, b.deps.sealer, 'org', 'org-a', 'org-a', 'SHARED', ORG_KEY);
    await putSecret(db, b.deps.sealer, 'agent', 'org-a', 'bot-1', 'SHARED', AGENT_KEY);
    await putSecret(db, b.deps.sealer, 'group', 'org-a', 'ops', 'GROUP_ONLY', 'group-value');
    await putSecret(db, b.deps.sealer, 'org', 'org-a', 'org-a', 'llmproxy:llm.api_key', 'sk-satellite-only');
    await putSecret(db, b.deps.sealer, 'agent', 'org-a', 'bot-1', 'agent:llmproxy.llm.api_key', 'sk-satellite-agent');
    const problem = (t: Tap, a: Answer, status: number) => {
      t.equal(a.status, status, `${status}: ${JSON.stringify(a.body).slice(0, 160)}`);
      t.match(a.type, /^application\/problem\+json/, 'a Problem document');
      t.match(a.body, { type: /^https:\/\/dvx\.dev\/problems\//, status, title: String });
    };

    t.test('discover and the JWKS need no credential', async (t) => {
      const d = await b.call('GET', '/v1/agent/discover');
      t.equal(d.status, 200);
      t.match(d.body, { service: 'dvx-broker', version: String, endpoints: { bootstrap: '/v1/agent/bootstrap' } });
      const j = await b.call('GET', '/.well-known/jwks.json');
      t.equal(j.status, 200);
      t.equal(j.body.keys.length, 1);
      t.notOk('d' in j.body.keys[0]);
    });

    let refresh1 = '';
    let jwt1 = '';
    t.test('bootstrap: the identity bundle, the agent active, audited', async (t) => {
      const token = await b.token('bot-1');
      const { csr, keyPem } = await newCsr();
      const a = await b.call('POST', '/v1/agent/bootstrap', { body: { token, csr } });
      t.equal(a.status, 200, JSON.stringify(a.body).slice(0, 200));
      t.match(a.body, {
        agent_id: 'bot-1',
        org_id: 'org-a',
        agent_name: 'builder',
        jwt: String,
        refresh_token: /^dvxr_/,
        config: { 'llmproxy.credential_mode': 'platform' },
        config_hash: String,
        certificate: /BEGIN CERTIFICATE/,
      });
      t.equal(a.headers['cache-control'], 'no-store');
      t.same(
        a.body.secrets,
        { SHARED: AGENT_KEY, GROUP_ONLY: 'group-value' },
        "the agent's own, merged; no satellite names",
      );
      const jwks = (await b.call('GET', '/.well-known/jwks.json')).body;
      const { payload } = await jwtVerify(a.body.jwt, createLocalJWKSet(jwks), {
        currentDate: new Date(b.clock.now()),
      });
      t.match(payload, { sub: 'bot-1', org_id: 'org-a', agent_name: 'builder', group_id: 'ops', iss: b.keys.issuer });
      t.equal(payload.exp! - payload.iat!, 300);
      const cert = new X509Certificate(a.body.certificate);
      t.equal(cert.subject, 'CN=bot-1\nO=org-a\nOU=ops');
      t.ok(cert.checkPrivateKey(createPrivateKey(keyPem)), "the certificate is for the CSR's key");

      t.match(await getAgent(db, 'bot-1'), { status: 'active', reason: 'bootstrapped' });
      const outbox = await db.query('SELECT status, reason FROM broker_status_outbox WHERE agent_uid = $1', ['bot-1']);
      t.same(outbox.rows, [{ status: 'active', reason: 'bootstrapped' }], 'reported to the control plane');
      t.match(b.deps.audit.records.at(-1), {
        action: 'agent.bootstrap',
        outcome: 'allow',
        actor: 'agent:bot-1',
        org_id: 'org-a',
        resource: 'agent:bot-1',
      });

      const again = await b.call('POST', '/v1/agent/bootstrap', { body: { token } });
      problem(t, again, 401);
      t.match(b.deps.audit.records.at(-1), { action: 'agent.bootstrap', outcome: 'deny' });
      refresh1 = a.body.refresh_token;
      jwt1 = a.body.jwt;
    });

    t.test('the JWT-guarded routes: secrets and config', async (t) => {
      const list = await b.call('GET', '/v1/agent/secrets', { jwt: jwt1 });
      t.equal(list.status, 200);
      t.same(list.body, { secrets: ['GROUP_ONLY', 'SHARED'] }, 'names only, no satellite secrets');
      const one = await b.call('GET', '/v1/agent/secrets/SHARED', { jwt: jwt1 });
      t.same(one.body, { name: 'SHARED', value: AGENT_KEY });
      t.equal(one.headers['cache-control'], 'no-store');
      for (const name of ['MISSING', 'llmproxy:llm.api_key', 'agent:llmproxy.llm.api_key', '__proto__', 'constructor'])
        problem(t, await b.call('GET', `/v1/agent/secrets/${encodeURIComponent(name)}`, { jwt: jwt1 }), 404);

      const cfg = await b.call('GET', '/v1/agent/config', { jwt: jwt1 });
      t.match(cfg.body, { config: { 'llmproxy.credential_mode': 'platform' }, config_hash: String });
      const put = await b.call('PUT', '/v1/agent/config/my.setting', { jwt: jwt1, body: { value: { depth: 3 } } });
      t.equal(put.status, 200);
      t.match(put.body.config, { 'my.setting': { depth: 3 } });
      t.not(put.body.config_hash, cfg.body.config_hash);
      t.match(b.deps.audit.records.at(-1), {
        action: 'agent.config.write',
        outcome: 'allow',
        attrs: { key: 'my.setting' },
      });
      const locked = await b.call('PUT', '/v1/agent/config/llmproxy.downstream_url', {
        jwt: jwt1,
        body: { value: 'x' },
      });
      problem(t, locked, 409);
      t.match(b.deps.audit.records.at(-1), { action: 'agent.config.write', outcome: 'deny' });
      problem(t, await b.call('PUT', '/v1/agent/config/bad%20key', { jwt: jwt1, body: { value: 1 } }), 400);
      problem(t, await b.call('PUT', '/v1/agent/config/k', { jwt: jwt1, body: {} }), 400);
      problem(t, await b.call('PUT', '/v1/agent/config/k', { jwt: jwt1, body: { value: 'a\u0000b' } }), 400);
      problem(t, await b.call('PUT', '/v1/agent/config/k', { jwt: jwt1, raw: '{"value":' }), 400);
      problem(
        t,
        await b.call('PUT', '/v1/agent/config/k', { jwt: jwt1, body: { value: 'x'.repeat(300 * 1024) } }),
        413,
      );
    });

    t.test('credentials the routes refuse: 401', async (t) => {
      const routes: [string, string, unknown?][] = [
        ['GET', '/v1/agent/secrets'],
        ['GET', '/v1/agent/secrets/SHARED'],
        ['GET', '/v1/agent/config'],
        ['PUT', '/v1/agent/config/k', { value: 1 }],
      ];
      const now = Math.floor(b.clock.now() / 1000);
      const other = await generateKeyPair('ES256');
      const { kid } = decodeProtectedHeader(jwt1);
      const forged = await new SignJWT({ org_id: 'org-a', agent_name: 'builder', group_id: 'ops' })
        .setProtectedHeader({ alg: 'ES256', kid })
        .setIssuer(b.keys.issuer)
        .setSubject('bot-1')
        .setIssuedAt(now)
        .setExpirationTime(now + 300)
        .sign(other.privateKey);
      const stranger = (await b.keys.mint({ sub: 'bot-nobody', org_id: 'org-a', agent_name: 'x', group_id: null })).jwt;
      const wrongOrg = (await b.keys.mint({ sub: 'bot-1', org_id: 'org-b', agent_name: 'x', group_id: null })).jwt;
      for (const [method, path, body] of routes) {
        problem(t, await b.call(method, path, { body }), 401);
        problem(t, await b.call(method, path, { body, jwt: 'not-a-jwt' }), 401);
        problem(t, await b.call(method, path, { body, jwt: forged }), 401);
        problem(t, await b.call(method, path, { body, jwt: stranger }), 401);
        problem(t, await b.call(method, path, { body, jwt: wrongOrg }), 401);
      }
      const a = await b.call('GET', '/v1/agent/config', { jwt: forged });
      t.match(a.body.detail, /signature/, 'the detail says why');
      t.equal(a.headers['www-authenticate'], 'Bearer');
      // An unauthenticated caller is refused before its body is read.
      problem(t, await b.call('PUT', '/v1/agent/config/k', { raw: 'x'.repeat(300 * 1024) }), 401);
    });

    let refresh2 = '';
    t.test('refresh: rotated; with a CSR a certificate', async (t) => {
      const { csr } = await newCsr();
      const a = await b.call('POST', '/v1/agent/refresh', { body: { refresh_token: refresh1, csr } });
      t.equal(a.status, 200, JSON.stringify(a.body).slice(0, 200));
      t.match(a.body, { jwt: String, refresh_token: /^dvxr_/, secrets: { SHARED: AGENT_KEY }, config_hash: String });
      t.match(a.body.certificate, /BEGIN CERTIFICATE/);
      t.not(a.body.refresh_token, refresh1);
      t.notOk('agent_id' in a.body);
      refresh2 = a.body.refresh_token;
      const b2 = await b.call('POST', '/v1/agent/refresh', { body: { refresh_token: refresh2 } });
      t.equal(b2.status, 200);
      t.notOk('certificate' in b2.body);
      refresh2 = b2.body.refresh_token;
    });

    t.test('replay of a used refresh token: 409, the family dead, the agent suspended', async (t) => {
      const a = await b.call('POST', '/v1/agent/refresh', { body: { refresh_token: refresh1 } });
      problem(t, a, 409);
      t.match(a.body.detail, /used before/);
      t.match(await getAgent(db, 'bot-1'), { status: 'suspended', reason: 'refresh_token_replayed' });
      const outbox = await db.query('SELECT status, reason FROM broker_status_outbox WHERE agent_uid = $1', ['bot-1']);
      t.same(outbox.rows, [{ status: 'suspended', reason: 'refresh_token_replayed' }], 'reported to the control plane');
      t.match(b.deps.audit.records.at(-1), {
        action: 'agent.refresh_token_replayed',
        outcome: 'deny',
        reason: 'refresh_token_replayed',
        attrs: { status: 'suspended' },
      });
      problem(t, await b.call('POST', '/v1/agent/refresh', { body: { refresh_token: refresh2 } }), 401);
      problem(t, await b.call('POST', '/v1/agent/refresh', { body: { refresh_token: refresh1 } }), 401);
      t.match(await getAgent(db, 'bot-1'), { status: 'suspended' }, 'a second replay changes nothing more');
    });

    t.test('a suspended, isolated or contained agent: 403 on every agent route; restored, back', async (t) => {
      await db.transaction((tx) => changeStatus(tx, 'bot-1', 'active', 'restored'));
      const token = await b.token('bot-1');
      const boot = await b.call('POST', '/v1/agent/bootstrap', { body: { token } });
      t.equal(boot.status, 200, 'restored and re-provisioned, it bootstraps again');
      const jwt = boot.body.jwt;
      const refresh = boot.body.refresh_token;
      for (const [set, label] of [
        ["status = 'suspended'", 'suspended'],
        ["status = 'isolated'", 'isolated'],
        ["status = 'active', contained = true", 'contained'],
      ] as const) {
        await db.query(`UPDATE broker_agents SET ${set} WHERE uid = 'bot-1'`);
        const fresh = await b.token('bot-1');
        for (const [method, path, body] of [
          ['GET', '/v1/agent/secrets'],
          ['GET', '/v1/agent/secrets/SHARED'],
          ['GET', '/v1/agent/config'],
          ['PUT', '/v1/agent/config/k', { value: 1 }],
        ] as const) {
          const a = await b.call(method, path, { body, jwt });
          problem(t, a, 403);
          t.match(a.body.detail, label);
        }
        problem(t, await b.call('POST', '/v1/agent/refresh', { body: { refresh_token: refresh } }), 403);
        problem(t, await b.call('POST', '/v1/agent/bootstrap', { body: { token: fresh } }), 403);
        const used = await db.query(
          'SELECT used_at FROM broker_bootstrap_tokens WHERE used_at IS NULL AND agent_uid = $1',
          ['bot-1'],
        );
        t.equal(used.rows.length, 1, `${label}: the refused bootstrap token is still unused`);
        t.match(b.deps.audit.records.at(-1), { outcome: 'deny', reason: new RegExp(label) });
      }
      await db.query("UPDATE broker_agents SET status = 'active', contained = false WHERE uid = 'bot-1'");
      t.equal((await b.call('GET', '/v1/agent/config', { jwt })).status, 200, 'restored: served again');
      t.equal((await b.call('POST', '/v1/agent/refresh', { body: { refresh_token: refresh } })).status, 200);
    });

    t.test('concurrent bootstrap with one token: exactly one winner', async (t) => {
      await addAgent(db, { uid: 'bot-race', org_id: 'org-a', name: 'racer' });
      const token = await b.token('bot-race');
      const answers = await Promise.all(
        Array.from({ length: 8 }, () => b.call('POST', '/v1/agent/bootstrap', { body: { token } })),
      );
      const statuses = answers.map((a) => a.status).sort();
      t.same(statuses, [200, 401, 401, 401, 401, 401, 401, 401], 'one 200, the others 401');
      const families = await db.query('SELECT 1 FROM broker_token_families WHERE agent_uid = $1', ['bot-race']);
      t.equal(families.rows.length, 1, 'one family');
      const winner = answers.find((a) => a.status === 200)!;
      t.equal(
        (await b.call('POST', '/v1/agent/refresh', { body: { refresh_token: winner.body.refresh_token } })).status,
        200,
      );
    });

    t.test('concurrent refreshes of one token: one wins, the other is a replay', async (t) => {
      await addAgent(db, { uid: 'bot-twin', org_id: 'org-a', name: 'twin' });
      const boot = await b.call('POST', '/v1/agent/bootstrap', { body: { token: await b.token('bot-twin') } });
      const answers = await Promise.all(
        [0, 1].map(() => b.call('POST', '/v1/agent/refresh', { body: { refresh_token: boot.body.refresh_token } })),
      );
      t.same(
        answers.map((a) => a.status).sort(),
        [200, 409],
        'one rotation wins; the copy presented beside it is a replay',
      );
      const winner = answers.find((a) => a.status === 200)!;
      problem(
        t,
        await b.call('POST', '/v1/agent/refresh', { body: { refresh_token: winner.body.refresh_token } }),
        401,
      );
      t.match(await getAgent(db, 'bot-twin'), { status: 'suspended', reason: 'refresh_token_replayed' });
    });

    t.test('bad, huge and garbage exchange bodies: 4xx Problems, nothing spent', async (t) => {
      await addAgent(db, { uid: 'bot-bad', org_id: 'org-a', name: 'bad' });
      const token = await b.token('bot-bad');
      for (const path of ['/v1/agent/bootstrap', '/v1/agent/refresh']) {
        problem(t, await b.call('POST', path, { raw: 'not json' }), 400);
        problem(t, await b.call('POST', path, { raw: '' }), 400);
        problem(t, await b.call('POST', path, { raw: '[]' }), 400);
        problem(t, await b.call('POST', path, { raw: '{"__proto__": {"x": 1}}' }), 400);
        problem(t, await b.call('POST', path, { body: {} }), 400);
        problem(t, await b.call('POST', path, { body: { token: 42, refresh_token: 42 } }), 400);
        problem(t, await b.call('POST', path, { body: { token: { $ne: 1 }, refresh_token: ['x'] } }), 400);
        problem(t, await b.call('POST', path, { raw: JSON.stringify({ token: 'x'.repeat(100_000) }) }), 413);
        problem(t, await b.call('POST', path, { raw: 'token=x', type: 'application/x-www-form-urlencoded' }), 415);
        problem(t, await b.call('POST', path), 400);
      }
      const extra = await b.call('POST', '/v1/agent/bootstrap', { body: { token, extra: 1 } });
      problem(t, extra, 400);
      t.equal(extra.body.detail, 'extra: unknown field', 'the detail names the field');
      const typed = await b.call('POST', '/v1/agent/refresh', { body: { refresh_token: 42 } });
      t.equal(typed.body.detail, 'refresh_token: must be a string');
      problem(t, await b.call('POST', '/v1/agent/bootstrap', { body: { token: 'dvxb_nope' } }), 401);
      problem(t, await b.call('POST', '/v1/agent/refresh', { body: { refresh_token: 'dvxr_nope' } }), 401);
      problem(t, await b.call('POST', '/v1/agent/bootstrap', { body: { token, csr: 'not a csr' } }), 400);
      const notP256 = await newCsr();
      const der = Buffer.from(notP256.csr.replace(/-----[^-]+-----|\s/g, ''), 'base64');
      der[der.length - 1] ^= 1;
      const tampered = `-----BEGIN CERTIFICATE REQUEST-----\n${der.toString('base64')}\n-----END CERTIFICATE REQUEST-----\n`;
      problem(t, await b.call('POST', '/v1/agent/bootstrap', { body: { token, csr: tampered } }), 400);
      t.match(await getAgent(db, 'bot-bad'), { status: 'provisioning' }, 'nothing changed');
      t.equal((await b.call('POST', '/v1/agent/bootstrap', { body: { token } })).status, 200, 'the token still works');
    });

    t.test('the audit store down: the exchange is refused (503), nothing changes', async (t) => {
      await addAgent(db, { uid: 'bot-audit', org_id: 'org-a', name: 'audit' });
      const token = await b.token('bot-audit');
      b.deps.audit.failing = true;
      t.teardown(() => {
        b.deps.audit.failing = false;
      });
      problem(t, await b.call('POST', '/v1/agent/bootstrap', { body: { token } }), 503);
      t.match(await getAgent(db, 'bot-audit'), { status: 'provisioning' });
      b.deps.audit.failing = false;
      t.equal((await b.call('POST', '/v1/agent/bootstrap', { body: { token } })).status, 200, 'then it goes through');
    });

    t.test('an expired JWT is refused; the next key still verifies old tokens across a rotation', async (t) => {
      const token = await b.token('bot-bad');
      const boot = await b.call('POST', '/v1/agent/bootstrap', { body: { token } });
      t.equal(boot.status, 200);
      b.clock.advance(24 * 3600_000 - 10 * 60_000);
      t.equal(await b.keys.rotateIfDue(), true, 'a new key is published');
      b.clock.advance(10 * 60_000 - 1000);
      const old = await b.call('POST', '/v1/agent/refresh', { body: { refresh_token: boot.body.refresh_token } });
      t.equal(old.status, 200, 'a refresh token lives its --refresh-ttl');
      b.clock.advance(2000);
      const fresh = await b.call('POST', '/v1/agent/refresh', { body: { refresh_token: old.body.refresh_token } });
      t.not(
        decodeProtectedHeader(fresh.body.jwt).kid,
        decodeProtectedHeader(old.body.jwt).kid,
        'signed by the new key',
      );
      t.equal(
        (await b.call('GET', '/v1/agent/config', { jwt: old.body.jwt })).status,
        200,
        'the old key still verifies',
      );
      b.clock.advance(301_000 + 5_000);
      const expired = await b.call('GET', '/v1/agent/config', { jwt: old.body.jwt });
      problem(t, expired, 401);
      t.match(expired.body.detail, /expired/);
    });

    t.test('no token, secret or key in any log line', async (t) => {
      const text = b.deps.logText();
      t.ok(text.length > 0, 'something was logged');
      for (const s of [ORG_KEY, AGENT_KEY, 'group-value', 'sk-satellite', 'dvxr_', 'dvxb_', 'eyJ'])
        t.notOk(text.includes(s), `no ${s.slice(0, 6)}… in the log`);
      const audit = JSON.stringify(b.deps.audit.records);
      for (const s of [ORG_KEY, AGENT_KEY, 'dvxr_', 'dvxb_', 'eyJ']) t.notOk(audit.includes(s), `nor in the audit`);
    });
  });
}
