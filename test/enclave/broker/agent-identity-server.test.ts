import t from 'tap';
import { readFile, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { createRemoteJWKSet, customFetch, decodeProtectedHeader } from 'jose';
import { fetchTrusting } from '../../../core/fetch.ts';
import { issueBootstrapToken } from '../../../enclave/broker/bootstrap-tokens.ts';
import { AgentAuthenticator } from '../../../proxy/llm/auth.ts';
import { startBrokerHarness } from '../../fixtures/broker-harness.ts';

// The identity wired into `dvx serve broker`: the enclave CA made under --state-dir on the first start,
// the agent routes on the agent listener, a JWT the broker minted accepted by llmproxy's authenticator
// against the broker's JWKS over TLS, and keys, CA and tokens surviving a restart.

const h = await startBrokerHarness();
t.teardown(() => h.close());
const state = join(h.dir, 'state');
const deps = () => h.broker.deps;
await deps().db.query(
  "INSERT INTO broker_agents (uid, org_id, group_id, name, status) VALUES ('bot-1', 'org-a', 'ops', 'builder', 'provisioning')",
);
await deps().db.query(
  `INSERT INTO broker_secrets (scope_kind, org_id, scope_id, name, sealed) VALUES
     ('org', 'org-a', 'org-a', 'API_KEY', $1), ('org', 'org-a', 'org-a', 'llmproxy:llm.api_key', $2)`,
  [await deps().sealer.seal('sk-agent-visible'), await deps().sealer.seal('sk-satellite-only')],
);
const token = () => issueBootstrapToken(deps().db, 'bot-1', 3600_000, Date.now());

t.test('the enclave CA is made under --state-dir, its key 0600', async (t) => {
  t.equal((await stat(join(state, 'enclave-ca.key'))).mode & 0o777, 0o600);
  t.match(await readFile(join(state, 'enclave-ca.pem'), 'utf8'), /BEGIN CERTIFICATE/);
  t.equal(h.broker.identity.ca.certPem, await readFile(join(state, 'enclave-ca.pem'), 'utf8'));
});

let jwt = '';
let refresh = '';
t.test('bootstrap on the agent listener; llmproxy accepts the JWT against the JWKS', async (t) => {
  const d = await h.agent('GET', '/v1/agent/discover');
  t.match(d.body, { service: 'dvx-broker' });
  const a = await h.agent('POST', '/v1/agent/bootstrap', { token: await token() });
  t.equal(a.status, 200, JSON.stringify(a.body).slice(0, 200));
  t.same(a.body.secrets, { API_KEY: 'sk-agent-visible' }, 'its own secrets; not the satellite one');
  t.match(a.body, { config: {}, config_hash: /^[0-9a-f]{64}$/ });
  jwt = a.body.jwt;
  refresh = a.body.refresh_token;
  const auth = new AgentAuthenticator({
    keys: () =>
      createRemoteJWKSet(new URL(`https://127.0.0.1:${h.broker.agentPort}/.well-known/jwks.json`), {
        [customFetch]: fetchTrusting(Buffer.from(h.tls.ca.certPem)),
      }),
  });
  t.match(await auth.verifyToken(jwt, 'authorization'), {
    agentId: 'bot-1',
    orgId: 'org-a',
    agentName: 'builder',
    groupId: 'ops',
    via: 'jwt',
  });
  t.match(h.audit.at(-1), { action: 'agent.bootstrap', outcome: 'allow', enclave_id: 'enc-test' });
  const put = await h.agent('PUT', '/v1/agent/config/my.key', { value: [1, 2] }, jwt);
  t.equal(put.status, 200);
  t.same(put.body.config, { 'my.key': [1, 2] });
});

t.test('a restart keeps the keys, the CA and the refresh-token family', async (t) => {
  const kid = decodeProtectedHeader(jwt).kid;
  const caPem = h.broker.identity.ca.certPem;
  await h.broker.close();
  await h.restart();
  t.equal(h.broker.identity.ca.certPem, caPem, 'the same CA');
  const jwks = await h.agent('GET', '/.well-known/jwks.json');
  t.same(
    jwks.body.keys.map((k: { kid: string }) => k.kid),
    [kid],
    'the same key',
  );
  t.equal((await h.agent('GET', '/v1/agent/secrets', undefined, jwt)).status, 200, 'a JWT from before verifies');
  const r = await h.agent('POST', '/v1/agent/refresh', { refresh_token: refresh });
  t.equal(r.status, 200, 'the refresh token from before rotates');
  t.equal(decodeProtectedHeader(r.body.jwt).kid, kid);
});

t.test('no secret, token or JWT in the log', async (t) => {
  const text = h.logs.join('');
  for (const s of ['sk-agent-visible', 'sk-satellite-only', 'dvxb_', 'dvxr_', jwt.slice(0, 40)])
    t.notOk(text.includes(s), `no ${s.slice(0, 8)}…`);
});
