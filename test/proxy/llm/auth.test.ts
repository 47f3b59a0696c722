import t from 'tap';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { Agent, request } from 'undici';
import { issueCertificate } from '../../../core/tls.ts';
import { hs256Token, noneToken, tokenIssuer } from '../../fixtures/agent-identity.ts';
import { startHarness, baseSnapshot } from '../../fixtures/llmproxy-harness.ts';

// Identity: every way a token must be refused, both headers, the verified-token cache, mTLS, and the
// agent states that close the door.
const h = await startHarness({ proxy: { agentCa: '' } });
t.teardown(() => h.close());

const body = JSON.stringify({ model: 'claude-sonnet-4-5', max_tokens: 8, messages: [{ role: 'user', content: 'hi' }] });
const messages = (headers: Record<string, string>) =>
  h.call('/v1/messages', { headers: { 'content-type': 'application/json', ...headers }, body });

t.test('a valid token in either header', async (t) => {
  const token = await h.token();
  t.equal((await messages({ authorization: `Bearer ${token}` })).status, 200);
  t.equal((await messages({ 'x-api-key': token })).status, 200);
});

t.test('refused tokens: 401 with WWW-Authenticate, never forwarded', async (t) => {
  const now = Math.floor(Date.now() / 1000);
  const other = await tokenIssuer('other-key');
  const stranger = await tokenIssuer('test-key'); // same kid, different key: a forgery
  const cases: [string, string][] = [
    ['missing', ''],
    ['garbage', 'not-a-jwt'],
    ['expired', await h.issuer.mint({}, { issuedAt: now - 400, expiresIn: 300 })],
    ['not yet valid', await h.issuer.mint({}, { notBefore: now + 120 })],
    ['lifetime over 5 minutes', await h.issuer.mint({}, { expiresIn: 3600 })],
    ['unknown kid', await other.mint()],
    ['forged signature', await stranger.mint()],
    ['HS256', await hs256Token()],
    ['alg none', noneToken()],
    ['no org_id', await h.issuer.mint({ org_id: undefined })],
  ];
  const before = h.upstream.received.length;
  for (const [name, token] of cases) {
    const r = await messages(token ? { authorization: `Bearer ${token}` } : {});
    t.equal(r.status, 401, name);
    t.equal(r.headers['www-authenticate'], 'Bearer', `${name}: WWW-Authenticate`);
    t.same(JSON.parse(r.text), {
      type: 'error',
      error: { type: 'authentication_error', message: 'invalid or missing agent credential' },
    });
  }
  t.equal(h.upstream.received.length, before);
  t.ok(
    h.logs.some(
      (l) =>
        l.msg === 'agent authentication failed' &&
        (l.err as { message?: string } | undefined)?.message === 'token expired' &&
        l.reason === 'expired',
    ),
    'the reason is logged',
  );
});

t.test('agent states: suspended, isolated, contained and a foreign org are refused 403', async (t) => {
  const snapshot = baseSnapshot(h.upstream.url) as { agents: Record<string, unknown> };
  snapshot.agents['agent-s'] = { org_id: 'org-1', name: 's', status: 'suspended', config: {} };
  snapshot.agents['agent-i'] = { org_id: 'org-1', name: 'i', status: 'isolated', config: {} };
  snapshot.agents['agent-c'] = { org_id: 'org-1', name: 'c', status: 'active', contained: true, config: {} };
  await h.writeSnapshot(snapshot);
  for (const sub of ['agent-s', 'agent-i', 'agent-c']) {
    const r = await messages({ 'x-api-key': await h.token({ sub }) });
    t.equal(r.status, 403, sub);
    t.match(JSON.parse(r.text), { error: { type: 'permission_error' } });
  }
  t.equal(
    (await messages({ 'x-api-key': await h.token({ org_id: 'org-2' }) })).status,
    403,
    'token org differs from the snapshot',
  );
  const unlisted = await messages({ 'x-api-key': await h.token({ sub: 'agent-new' }) });
  t.equal(
    unlisted.status,
    500,
    'an agent the snapshot does not list yet is served under its org: past auth, to the credential',
  );
  t.same(JSON.parse(unlisted.text), {
    type: 'error',
    error: { type: 'api_error', message: 'no LLM API credential configured' },
  });
  await h.writeSnapshot(baseSnapshot(h.upstream.url));
});

t.test('the JWKS file is re-read when keys rotate', async (t) => {
  const rotated = await tokenIssuer('rotated');
  await writeFile(join(h.dir, 'jwks.json'), JSON.stringify({ keys: [...h.issuer.jwks.keys, ...rotated.jwks.keys] }));
  let status = 0;
  for (let i = 0; i < 20 && status !== 200; i++) {
    await new Promise((r) => setTimeout(r, 100));
    status = (await messages({ 'x-api-key': await rotated.mint() })).status;
  }
  t.equal(status, 200);
});

t.test('mTLS: an agent identity certificate from --agent-ca is a way in; a token still wins', async (t) => {
  const m = await startHarness({ proxy: { agentCa: '' } });
  t.teardown(() => m.close());
  // Restart with the agent CA: the harness's CA also signs agent certificates here.
  await m.proxy.close();
  const { startLlmProxy } = await import('../../../proxy/llm/server.ts');
  const { createLogger } = await import('../../../core/logger.ts');
  const proxy = await startLlmProxy(
    {
      addr: '127.0.0.1:0',
      tlsCert: join(m.dir, 'server.pem'),
      tlsKey: join(m.dir, 'server-key.pem'),
      agentCa: join(m.dir, 'ca.pem'),
      policySnapshot: join(m.dir, 'snapshot.json'),
      secretsFile: join(m.dir, 'secrets.json'),
    },
    {
      logger: createLogger({ level: 'error', destination: { write: () => {} } }),
      audit: { append: async () => {}, flush: async () => {}, close: async () => {} },
    },
  );
  t.teardown(() => proxy.close());
  const agentCert = await issueCertificate(m.ca, { commonName: 'agent-1', usage: 'client', lifetimeMs: 5 * 60_000 });
  const withCert = new Agent({ connect: { ca: m.ca.certPem, cert: agentCert.certPem, key: agentCert.keyPem } });
  t.teardown(() => withCert.close());
  const go = (dispatcher: Agent, headers: Record<string, string> = {}) =>
    request(`https://127.0.0.1:${proxy.port}/v1/messages`, {
      method: 'POST',
      body,
      headers: { 'content-type': 'application/json', ...headers },
      dispatcher,
    });
  const noOrg = await go(withCert);
  t.equal(noOrg.statusCode, 401, 'a certificate without O (org) is not an identity');
  await noOrg.body.text();
  const good = await issueCertificateWithOrg(m.ca);
  const withGood = new Agent({ connect: { ca: m.ca.certPem, cert: good.certPem, key: good.keyPem } });
  t.teardown(() => withGood.close());
  const ok = await go(withGood);
  t.equal(ok.statusCode, 200, await ok.body.text());
  const bad = await go(withGood, { authorization: 'Bearer eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln' });
  t.equal(bad.statusCode, 401, 'a bad token is not rescued by a good certificate');
  await bad.body.text();
});

async function issueCertificateWithOrg(ca: { certPem: string; keyPem: string }) {
  // CN = agent id, O = org id: issueCertificate takes a common name only, so build the subject here.
  const x509 = await import('@peculiar/x509');
  const { webcrypto, createPrivateKey } = await import('node:crypto');
  const alg = { name: 'ECDSA', namedCurve: 'P-256', hash: 'SHA-256' } as const;
  const caCert = new x509.X509Certificate(ca.certPem);
  const caKey = await webcrypto.subtle.importKey(
    'pkcs8',
    createPrivateKey(ca.keyPem).export({ format: 'der', type: 'pkcs8' }),
    alg,
    false,
    ['sign'],
  );
  const keys = await webcrypto.subtle.generateKey(alg, true, ['sign', 'verify']);
  const cert = await x509.X509CertificateGenerator.create({
    serialNumber: '01ab',
    subject: 'CN=agent-1, O=org-1',
    issuer: caCert.subject,
    notBefore: new Date(Date.now() - 60_000),
    notAfter: new Date(Date.now() + 300_000),
    publicKey: keys.publicKey as never,
    signingKey: caKey as never,
    signingAlgorithm: alg,
    extensions: [new x509.ExtendedKeyUsageExtension([x509.ExtendedKeyUsage.clientAuth])],
  });
  const der = Buffer.from(await webcrypto.subtle.exportKey('pkcs8', keys.privateKey));
  return {
    certPem: cert.toString('pem'),
    keyPem: `-----BEGIN PRIVATE KEY-----\n${der.toString('base64').replace(/(.{64})/g, '$1\n')}\n-----END PRIVATE KEY-----\n`,
  };
}
