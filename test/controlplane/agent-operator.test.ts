import t from 'tap';
import { createLocalJWKSet, jwtVerify, generateKeyPair, SignJWT } from 'jose';
import { startCpHarness } from '../fixtures/controlplane-harness.ts';

// The agent-operator issuer: discovery and JWKS at its public base URL, minting under agents:manage,
// a kind no claim can choose, refusal on every capability-gated route, expiry, no fallback to OIDC.
const h = await startCpHarness(
  [
    { clientId: 'root', org: 'org-a' },
    { clientId: 'gateway', org: 'org-a' },
  ],
  { seedAdmin: ['root'] },
);
t.teardown(() => h.close());
const issuerUrl = 'https://cp.dvx.test:8443';
const cp = await h.start({ seedAdmin: ['root'], agentTokenIssuerUrl: issuerUrl, agentTokenTtl: 2000 });
t.teardown(() => cp.close());
const call = (persona: string | null, method: string, path: string, body?: unknown) =>
  h.callAt(cp.port, persona, method, path, body);
const withToken = async (token: string, method: string, path: string) => {
  const r = await h.rawAt(cp.port, method, `/api/v1${path}`, undefined, { authorization: `Bearer ${token}` });
  return { status: r.status, body: r.text ? JSON.parse(r.text) : null };
};

t.test('discovery and keys at the public base URL; minted tokens verify against them', async (t) => {
  await call('root', 'POST', '/orgs', { id: 'org-a', name: 'A' });
  await call('root', 'POST', '/orgs/org-a/grants', { principal: 'user:gateway', capability: 'agents:manage' });
  const discovery = JSON.parse((await h.rawAt(cp.port, 'GET', '/.well-known/openid-configuration')).text);
  t.match(discovery, {
    issuer: issuerUrl,
    jwks_uri: `${issuerUrl}/.well-known/jwks.json`,
    id_token_signing_alg_values_supported: ['ES256'],
  });
  const jwks = JSON.parse((await h.rawAt(cp.port, 'GET', '/.well-known/jwks.json')).text);
  t.equal(jwks.keys.length, 1);
  t.notOk('d' in jwks.keys[0], 'no private part');
  const minted = await call('gateway', 'POST', '/orgs/org-a/agents/agent-7/operator-token');
  t.equal(minted.status, 200);
  t.match(minted.body, { token_type: 'Bearer', expires_in: 2 });
  const { payload } = await jwtVerify(minted.body.access_token, createLocalJWKSet(jwks), { issuer: issuerUrl });
  t.match(payload, { sub: 'agent:agent-7', org_id: 'org-a' });
  t.match(h.audit.at(-1), { action: 'agent-operator-token.mint', actor: 'gateway', resource: 'agent:agent-7' });

  const who = await withToken(minted.body.access_token, 'GET', '/whoami');
  t.same(who.body, { subject: 'agent:agent-7', kind: 'agent-operator', org_id: 'org-a', groups: [], capabilities: [] });
  await call('root', 'POST', '/orgs/org-a/grants', { principal: 'agent:agent-7', role: 'auditor' });
  const gated = await withToken(minted.body.access_token, 'GET', '/orgs/org-a/grants');
  t.equal(gated.status, 403, 'capability-gated routes refuse the kind, whatever it was granted');
  t.match(gated.body, { detail: /agent operators/ });
  t.equal(
    (await call('root', 'POST', '/orgs/org-b/agents/agent-7/operator-token')).status,
    200,
    'the platform admin may mint for any org',
  );
  t.equal(
    (await call('gateway', 'POST', '/orgs/org-b/agents/agent-7/operator-token')).status,
    403,
    'the gateway only for its org',
  );
  t.equal((await call('gateway', 'POST', '/orgs/org-a/agents/bad%20id/operator-token')).status, 400);

  await new Promise((r) => setTimeout(r, 4500));
  t.equal((await withToken(minted.body.access_token, 'GET', '/whoami')).status, 401, 'expired after the TTL');
});

t.test('a token naming this issuer but signed elsewhere is refused, not retried as OIDC', async (t) => {
  const { privateKey } = await generateKeyPair('ES256');
  const forged = await new SignJWT({ org_id: 'org-a' })
    .setProtectedHeader({ alg: 'ES256', kid: 'x' })
    .setIssuer(issuerUrl)
    .setAudience(issuerUrl)
    .setSubject('agent:agent-7')
    .setIssuedAt()
    .setExpirationTime('1m')
    .sign(privateKey);
  t.equal((await withToken(forged, 'GET', '/whoami')).status, 401);
  const humanish = await new SignJWT({ org_id: 'org-a' })
    .setProtectedHeader({ alg: 'ES256', kid: 'x' })
    .setIssuer(issuerUrl)
    .setAudience(issuerUrl)
    .setSubject('root')
    .setIssuedAt()
    .setExpirationTime('1m')
    .sign(privateKey);
  t.equal((await withToken(humanish, 'GET', '/whoami')).status, 401);
});
