import t, { type Test } from 'tap';
import fc from 'fast-check';
import { generateKeyPairSync, webcrypto } from 'node:crypto';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { SignJWT } from 'jose';
import { AgentAuthenticator, type AgentIdentity } from '../../../proxy/llm/auth.ts';
import { AuthError } from '../../../proxy/llm/errors.ts';
import {
  GATEWAY_IDENTITY_HEADER,
  GatewayIdentitySigner,
  GatewayIdentityVerifier,
  readSigningKey,
  readVerifyKeys,
  type KeyProblem,
} from '../../../proxy/llm/gateway-identity.ts';
import { gatewayKey } from '../../fixtures/gateway-key.ts';

// The gateway's identity header on its own: what signs, what verifies, every way a header must be
// refused (with the AuthError the 401 is made of), the cache, and the key files both ends read. The
// same header through a real llmproxy: gateway-identity-llmproxy.test.ts.

const dir = await mkdtemp(join(tmpdir(), 'dvx-gw-identity-'));
t.teardown(() => rm(dir, { recursive: true, force: true }));
const key = await gatewayKey(dir);
const other = await gatewayKey(dir, 'other');

class KeyFileError extends Error {}
const fail: KeyProblem = (message) => {
  throw new KeyFileError(message);
};

const agent: AgentIdentity = {
  agentId: 'agent-1',
  orgId: 'org-1',
  agentName: 'builder',
  groupId: 'g-1',
  via: 'jwt',
  tokenHeader: 'x-api-key',
};
const request = { method: 'POST', url: '/v1/messages' };
const signer = new GatewayIdentitySigner(key.privateKey);
const verifier = () => new GatewayIdentityVerifier([key.publicKey]);

/** A header with the given protected header and claims over the gateway's defaults, signed by `signWith`. */
async function crafted(
  claims: Record<string, unknown> = {},
  header: Record<string, unknown> = {},
  signWith = key.privateKey,
): Promise<string> {
  const now = Math.floor(Date.now() / 1000);
  return new SignJWT({
    iss: 'dvx-gateway',
    aud: 'dvx-llmproxy',
    sub: 'agent-1',
    org_id: 'org-1',
    agent_name: 'builder',
    group_id: 'g-1',
    via: 'jwt',
    htm: 'POST',
    htu: '/v1/messages',
    iat: now,
    exp: now + 60,
    jti: 'j-1',
    ...claims,
  })
    .setProtectedHeader({ alg: 'ES256', typ: 'dvx-gateway-identity+jwt', ...header } as never)
    .sign(signWith);
}

async function refused(t: Test, v: GatewayIdentityVerifier, header: string, req = request): Promise<AuthError | null> {
  try {
    await v.verify(header, req);
  } catch (err) {
    t.type(err, AuthError);
    t.equal((err as AuthError).reason, 'gateway', 'the metric label');
    return err as AuthError;
  }
  t.fail('the header was believed');
  return null;
}

t.test('a signed header verifies as the agent, via the gateway, with no token header', async (t) => {
  const header = await signer.sign(agent, 'POST', '/v1/messages');
  t.same(await verifier().verify(header, request), {
    agentId: 'agent-1',
    orgId: 'org-1',
    agentName: 'builder',
    groupId: 'g-1',
    via: 'gateway',
    tokenHeader: null,
  });
  const [head, body] = header
    .split('.')
    .slice(0, 2)
    .map((p) => JSON.parse(Buffer.from(p, 'base64url').toString()));
  t.same(head, { alg: 'ES256', typ: 'dvx-gateway-identity+jwt' });
  t.match(body, {
    iss: 'dvx-gateway',
    aud: 'dvx-llmproxy',
    sub: 'agent-1',
    org_id: 'org-1',
    agent_name: 'builder',
    group_id: 'g-1',
    via: 'jwt',
    htm: 'POST',
    htu: '/v1/messages',
    jti: String,
  });
  t.equal(body.exp - body.iat, 60);
  const grouplessAgent = { ...agent, groupId: null, via: 'mtls' as const, tokenHeader: null };
  const groupless = await signer.sign(grouplessAgent, 'GET', '/v1/models?limit=2');
  t.match(JSON.parse(Buffer.from(groupless.split('.')[1]!, 'base64url').toString()), { group_id: null, via: 'mtls' });
  t.equal((await verifier().verify(groupless, { method: 'GET', url: '/v1/models?limit=2' })).groupId, null);
  t.not(
    await signer.sign(agent, 'POST', '/v1/messages'),
    await signer.sign(agent, 'POST', '/v1/messages'),
    'every header is its own (jti)',
  );
});

t.test('forged, wrong claims, wrong algorithm: refused', async (t) => {
  const v = verifier();
  const now = Math.floor(Date.now() / 1000);
  const b64 = (o: unknown) => Buffer.from(JSON.stringify(o)).toString('base64url');
  const valid = await crafted();
  const [h64, p64] = valid.split('.');
  const cases: [string, string, boolean][] = [
    // [what, header, whether the gateway's signature verified (the refusal names the agent)]
    ['signed by another key', await crafted({}, {}, other.privateKey), false],
    ['expired', await crafted({ iat: now - 120, exp: now - 60 }), true],
    ['issued in the future', await crafted({ iat: now + 120, exp: now + 180 }), true],
    ['lifetime over 60 s', await crafted({ exp: now + 3600 }), true],
    ['wrong aud', await crafted({ aud: 'dvx-controlplane' }), true],
    ['wrong iss', await crafted({ iss: 'someone' }), true],
    ['no jti', await crafted({ jti: undefined }), true],
    ['a platform JWT type', await crafted({}, { typ: 'JWT' }), true],
    ['no typ', await crafted({}, { typ: undefined }), true],
    ['alg none', `${b64({ alg: 'none', typ: 'dvx-gateway-identity+jwt' })}.${p64}.`, false],
    [
      'HS256',
      await new SignJWT({ iss: 'dvx-gateway', aud: 'dvx-llmproxy', sub: 'agent-1', org_id: 'org-1', via: 'jwt' })
        .setProtectedHeader({ alg: 'HS256', typ: 'dvx-gateway-identity+jwt' })
        .setIssuedAt()
        .setExpirationTime('60s')
        .setJti('x')
        .sign(webcrypto.getRandomValues(new Uint8Array(32))),
      false,
    ],
    [
      'payload swapped under a valid signature',
      `${h64}.${b64({ sub: 'agent-2', org_id: 'org-1' })}.${valid.split('.')[2]}`,
      false,
    ],
    ['garbage', 'not-a-jws', false],
    ['no org_id', await crafted({ org_id: undefined }), false],
    ['via gateway (a chain)', await crafted({ via: 'gateway' }), false],
    ['no htu', await crafted({ htu: undefined }), true],
    ['oversized', `eyJ${'A'.repeat(5000)}.${p64}.${valid.split('.')[2]}`, false],
  ];
  for (const [name, header, signed] of cases) {
    const err = await refused(t, v, header);
    t.equal(err?.identity?.agentId ?? null, signed ? 'agent-1' : null, `${name}: the agent named only when signed`);
    t.ok(err?.message.startsWith('gateway identity header'), `${name}: ${err?.message}`);
  }
});

t.test('the header names its request: another method, path or query is refused, cached or not', async (t) => {
  const v = verifier();
  const header = await signer.sign(agent, 'POST', '/v1/messages?beta=true');
  await refused(t, v, header, { method: 'POST', url: '/v1/messages' });
  t.equal((await v.verify(header, { method: 'POST', url: '/v1/messages?beta=true' })).agentId, 'agent-1');
  for (const other of [
    { method: 'GET', url: '/v1/messages?beta=true' },
    { method: 'POST', url: '/v1/chat/completions' },
    { method: 'POST', url: '/v1/messages?beta=false' },
    { method: 'post', url: '/v1/messages?beta=true' },
  ]) {
    const err = await refused(t, v, header, other);
    t.equal(err?.identity?.agentId, 'agent-1', "a replay is the agent's (the gateway signed it)");
    t.match(err?.message, /names another request/);
  }
});

t.test('property: a header verifies for exactly the method and URL it was signed for', async (t) => {
  const v = verifier();
  const method = fc.constantFrom('GET', 'POST', 'PUT', 'DELETE', 'PATCH', 'HEAD');
  const url = fc.webPath().map((p) => (p.startsWith('/') ? p : `/${p}`));
  const query = fc.option(fc.webQueryParameters(), { nil: undefined });
  const req = fc.record({ method, url: fc.tuple(url, query).map(([p, q]) => (q === undefined ? p : `${p}?${q}`)) });
  await fc.assert(
    fc.asyncProperty(req, req, async (signed, sent) => {
      const header = await signer.sign(agent, signed.method, signed.url);
      const same = signed.method === sent.method && signed.url === sent.url;
      const ok = await v.verify(header, sent).then(
        () => true,
        (err: unknown) => {
          if (!(err instanceof AuthError) || err.reason !== 'gateway') throw err;
          return false;
        },
      );
      return ok === same;
    }),
    { numRuns: 150 },
  );
  t.pass('held for every pair');
});

t.test('a cached header is believed until its exp only', async (t) => {
  let now = Date.now();
  const v = new GatewayIdentityVerifier([key.publicKey], { now: () => now });
  const header = await new GatewayIdentitySigner(key.privateKey, () => now).sign(agent, 'POST', '/v1/messages');
  t.equal((await v.verify(header, request)).agentId, 'agent-1');
  now += 30_000;
  t.equal((await v.verify(header, request)).agentId, 'agent-1', 'from the cache, within its life');
  now += 32_000;
  t.equal((await v.verify(header, request)).agentId, 'agent-1', 'past exp, within the 5 s clock tolerance');
  now += 5_000;
  const err = await refused(t, v, header);
  t.match(err?.message, /expired/, 'past the tolerance');
});

t.test('a verify file of two keys (a rotation) believes both, and nothing else', async (t) => {
  const both = join(dir, 'both.pem');
  await writeFile(both, key.publicPem + other.privatePem);
  const v = new GatewayIdentityVerifier(await readVerifyKeys(both, '--gateway-key', fail));
  t.equal((await v.verify(await signer.sign(agent, 'POST', '/x'), { method: 'POST', url: '/x' })).via, 'gateway');
  const byOther = new GatewayIdentitySigner(other.privateKey);
  t.equal((await v.verify(await byOther.sign(agent, 'POST', '/x'), { method: 'POST', url: '/x' })).via, 'gateway');
  const third = await gatewayKey(dir, 'third');
  await refused(t, v, await new GatewayIdentitySigner(third.privateKey).sign(agent, 'POST', '/x'), {
    method: 'POST',
    url: '/x',
  });
});

t.test('key files: what each end accepts, and a clear refusal of the rest', async (t) => {
  const file = async (name: string, text: string) => {
    const path = join(dir, name);
    await writeFile(path, text);
    return path;
  };
  const rsa = generateKeyPairSync('rsa', { modulusLength: 2048 });
  const p384 = generateKeyPairSync('ec', { namedCurve: 'P-384' });
  const sec1 = key.privateKey.export({ type: 'sec1', format: 'pem' }).toString();
  const ecParams = '-----BEGIN EC PARAMETERS-----\nBggqhkjOPQMBBw==\n-----END EC PARAMETERS-----\n';

  t.equal((await readSigningKey(key.privatePath, '--gateway-key', fail)).asymmetricKeyType, 'ec');
  t.equal((await readSigningKey(await file('sec1.pem', ecParams + sec1), '--gateway-key', fail)).type, 'private');
  const signing: [string, string, RegExp][] = [
    ['missing', join(dir, 'nope.pem'), /cannot read --gateway-key .*nope\.pem: ENOENT/],
    ['a public key', key.publicPath, /must hold one EC P-256 private key/],
    ['two keys', await file('two.pem', key.privatePem + other.privatePem), /must hold one/],
    ['empty', await file('empty.pem', ''), /must hold one/],
    [
      'RSA',
      await file('rsa.pem', rsa.privateKey.export({ type: 'pkcs8', format: 'pem' }).toString()),
      /not an EC P-256 key/,
    ],
    [
      'P-384',
      await file('p384.pem', p384.privateKey.export({ type: 'pkcs8', format: 'pem' }).toString()),
      /not an EC P-256 key/,
    ],
    [
      'a damaged key',
      await file('bad.pem', '-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n'),
      /not hold a readable private key/,
    ],
  ];
  for (const [name, path, message] of signing)
    await t.rejects(readSigningKey(path, '--gateway-key', fail), message, `signing: ${name}`);

  t.equal((await readVerifyKeys(key.publicPath, '--gateway-key', fail)).length, 1, 'the public key');
  const derived = await readVerifyKeys(key.privatePath, '--gateway-key', fail);
  t.ok(derived[0]!.equals(key.publicKey), 'the private PEM: its public key');
  const verifying: [string, string, RegExp][] = [
    ['missing', join(dir, 'nope.pem'), /cannot read --gateway-key/],
    ['empty', await file('empty2.pem', 'hello'), /holds no PEM key/],
    [
      'RSA',
      await file('rsa-pub.pem', rsa.publicKey.export({ type: 'spki', format: 'pem' }).toString()),
      /not an EC P-256 key/,
    ],
    [
      'damaged',
      await file('bad-pub.pem', '-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n'),
      /not a readable key/,
    ],
  ];
  for (const [name, path, message] of verifying)
    await t.rejects(readVerifyKeys(path, '--gateway-key', fail), message, `verifying: ${name}`);
});

t.test('AgentAuthenticator: the header first, and refused where it cannot be verified', async (t) => {
  const noJwks = () => () => Promise.reject(new Error('no JWKS configured'));
  const header = await signer.sign(agent, 'POST', '/v1/messages');
  const withKey = new AgentAuthenticator({ keys: noJwks, gateway: verifier() });
  t.equal((await withKey.authenticate({ [GATEWAY_IDENTITY_HEADER]: header }, null, request)).via, 'gateway');
  const attempts: [string, AgentAuthenticator, Record<string, unknown>, typeof request | null, RegExp][] = [
    [
      'no --gateway-key',
      new AgentAuthenticator({ keys: noJwks }),
      { [GATEWAY_IDENTITY_HEADER]: header },
      request,
      /no --gateway-key/,
    ],
    ['no request to check it against', withKey, { [GATEWAY_IDENTITY_HEADER]: header }, null, /none can be checked/],
    ['sent twice', withKey, { [GATEWAY_IDENTITY_HEADER]: [header, header] }, request, /none can be checked/],
    ['empty', withKey, { [GATEWAY_IDENTITY_HEADER]: '' }, request, /malformed/],
  ];
  for (const [name, auth, headers, req, message] of attempts) {
    const err = await auth.authenticate(headers as never, null, req).then(
      () => null,
      (e: unknown) => e,
    );
    t.type(err, AuthError, name);
    t.equal((err as AuthError).reason, 'gateway', name);
    t.match((err as AuthError).message, message, name);
  }
});
