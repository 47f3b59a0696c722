import t from 'tap';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Anthropic from '@anthropic-ai/sdk';
import { fetch as undiciFetch } from 'undici';
import { SignJWT } from 'jose';
import type { AgentIdentity } from '../../../proxy/llm/auth.ts';
import { GATEWAY_IDENTITY_HEADER, GatewayIdentitySigner } from '../../../proxy/llm/gateway-identity.ts';
import { startLlmProxy } from '../../../proxy/llm/server.ts';
import { OptionsError } from '../../../proxy/llm/errors.ts';
import { gatewayKey } from '../../fixtures/gateway-key.ts';
import {
  anthropicBody,
  baseSnapshot,
  PLATFORM_KEY,
  recordAfter,
  startHarness,
  type Harness,
} from '../../fixtures/llmproxy-harness.ts';

// The gateway's identity header through a real llmproxy (--gateway-key) to a real upstream: believed
// when it verifies and names the request, refused 401 otherwise (and by a llmproxy without the key),
// the agent's state applied as for any caller, both credential modes, and the official Anthropic SDK.

const dir = await mkdtemp(join(tmpdir(), 'dvx-gw-llmproxy-'));
t.teardown(() => rm(dir, { recursive: true, force: true }));
const key = await gatewayKey(dir);
const other = await gatewayKey(dir, 'other');

const snapshot = (upstreamUrl: string) => {
  const s = baseSnapshot(upstreamUrl) as { agents: Record<string, unknown>; orgs: Record<string, unknown> };
  s.agents['agent-s'] = { org_id: 'org-1', name: 's', status: 'suspended', config: {} };
  s.agents['agent-c'] = { org_id: 'org-1', name: 'c', status: 'active', contained: true, config: {} };
  s.orgs['org-p'] = { config: { credential_mode: { value: 'passthrough' } }, flags: { 'audit:llm': true } };
  s.agents['agent-p'] = { org_id: 'org-p', name: 'own-key', config: {} };
  return s;
};
// The public key: llmproxy never needs the gateway's private one.
const h = await startHarness({ snapshot, proxy: { gatewayKey: key.publicPath } });
t.teardown(() => h.close());

const builder: AgentIdentity = {
  agentId: 'agent-1',
  orgId: 'org-1',
  agentName: 'builder',
  groupId: 'g-1',
  via: 'jwt',
  tokenHeader: 'authorization',
};
const signer = new GatewayIdentitySigner(key.privateKey);
const vouch = (identity: AgentIdentity = builder, method = 'POST', path = '/v1/messages') =>
  signer.sign(identity, method, path);
const send = (path: string, headers: Record<string, string>, body = anthropicBody('hi')) =>
  h.call(path, { headers: { 'content-type': 'application/json', ...headers }, body });

t.test('a signed header and no JWT: through to the upstream, audited as the agent', async (t) => {
  const before = h.audit.length;
  const r = await send('/v1/messages', { [GATEWAY_IDENTITY_HEADER]: await vouch(), 'x-api-key': 'sk-dummy-agent-key' });
  t.equal(r.status, 200, r.text);
  const got = h.upstream.received.at(-1)!;
  t.equal(got.path, '/v1/messages');
  t.equal(got.headers['x-api-key'], PLATFORM_KEY, "platform mode: the agent's dummy key is replaced");
  t.notOk(GATEWAY_IDENTITY_HEADER in got.headers, 'the header vouches to llmproxy, never to a provider');
  t.match(await recordAfter(h, before), {
    agent_id: 'agent-1',
    org_id: 'org-1',
    agent_name: 'builder',
    decision: 'allow',
    status: 200,
  });
});

t.test("passthrough mode: the agent's own key goes on, from either header", async (t) => {
  const agent = { ...builder, agentId: 'agent-p', orgId: 'org-p', groupId: null };
  const viaKey = await send('/v1/messages', {
    [GATEWAY_IDENTITY_HEADER]: await vouch(agent),
    'x-api-key': 'sk-ant-agents-own-key-1',
  });
  t.equal(viaKey.status, 200, viaKey.text);
  t.equal(h.upstream.received.at(-1)!.headers['x-api-key'], 'sk-ant-agents-own-key-1');
  const chat = JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] });
  const viaAuth = await send(
    '/v1/chat/completions',
    {
      [GATEWAY_IDENTITY_HEADER]: await vouch(agent, 'POST', '/v1/chat/completions'),
      authorization: 'Bearer sk-openai-agents-own-key-2',
    },
    chat,
  );
  t.equal(viaAuth.status, 200, viaAuth.text);
  t.equal(h.upstream.received.at(-1)!.headers.authorization, 'Bearer sk-openai-agents-own-key-2');
  const none = await send('/v1/messages', { [GATEWAY_IDENTITY_HEADER]: await vouch(agent) });
  t.equal(none.status, 500, 'passthrough without a key of its own');
  t.match(JSON.parse(none.text), { error: { message: 'no LLM API credential configured' } });
});

t.test('refused headers: 401, nothing reaches the upstream, a valid JWT rescues none', async (t) => {
  const now = Math.floor(Date.now() / 1000);
  const claims = {
    iss: 'dvx-gateway',
    aud: 'dvx-llmproxy',
    sub: 'agent-1',
    org_id: 'org-1',
    via: 'jwt',
    htm: 'POST',
    htu: '/v1/messages',
    iat: now,
    exp: now + 60,
    jti: 'j',
  };
  const craft = (
    over: Record<string, unknown>,
    alg = 'ES256',
    signWith: Parameters<SignJWT['sign']>[0] = key.privateKey,
  ) => new SignJWT({ ...claims, ...over }).setProtectedHeader({ alg, typ: 'dvx-gateway-identity+jwt' }).sign(signWith);
  const b64 = (o: unknown) => Buffer.from(JSON.stringify(o)).toString('base64url');
  const cases: [string, string][] = [
    ['forged (another key)', await new GatewayIdentitySigner(other.privateKey).sign(builder, 'POST', '/v1/messages')],
    ['expired', await craft({ iat: now - 130, exp: now - 70 })],
    ['wrong aud', await craft({ aud: 'dvx-controlplane' })],
    ['alg none', `${b64({ alg: 'none', typ: 'dvx-gateway-identity+jwt' })}.${b64(claims)}.`],
    ['HS256', await craft({}, 'HS256', new Uint8Array(32).fill(7))],
    ['replayed on another path', await vouch(builder, 'POST', '/v1/chat/completions')],
    ['replayed with another method', await vouch(builder, 'PUT', '/v1/messages')],
  ];
  const before = h.upstream.received.length;
  const jwt = await h.token();
  for (const [name, header] of cases) {
    for (const withJwt of [false, true]) {
      const r = await send('/v1/messages', {
        [GATEWAY_IDENTITY_HEADER]: header,
        ...(withJwt ? { authorization: `Bearer ${jwt}` } : {}),
      });
      t.equal(r.status, 401, `${name}${withJwt ? ', with a valid JWT too' : ''}`);
      t.same(JSON.parse(r.text), {
        type: 'error',
        error: { type: 'authentication_error', message: 'invalid or missing agent credential' },
      });
    }
  }
  t.equal(h.upstream.received.length, before, 'nothing was forwarded');
  t.ok(
    h.logs.some((l) => l.msg === 'agent authentication failed' && l.reason === 'gateway'),
    "logged with the reason 'gateway' (the metric label)",
  );
});

t.test('the snapshot decides the agent state: suspended or contained through the gateway is 403', async (t) => {
  for (const agentId of ['agent-s', 'agent-c']) {
    const before = h.audit.length;
    const r = await send('/v1/messages', { [GATEWAY_IDENTITY_HEADER]: await vouch({ ...builder, agentId }) });
    t.equal(r.status, 403, agentId);
    t.match(await recordAfter(h, before), { agent_id: agentId, decision: 'deny' });
  }
});

t.test('the official Anthropic SDK, pointed at llmproxy with the header in defaultHeaders', async (t) => {
  const client = new Anthropic({
    apiKey: 'sk-ant-dummy',
    baseURL: h.url,
    maxRetries: 0,
    defaultHeaders: { [GATEWAY_IDENTITY_HEADER]: await vouch() },
    fetch: ((url: string, init: RequestInit) =>
      undiciFetch(url, { ...(init as object), dispatcher: h.dispatcher } as never)) as unknown as typeof fetch,
  });
  const message = await client.messages.create({
    model: 'claude-sonnet-4-5',
    max_tokens: 8,
    messages: [{ role: 'user', content: 'hello' }],
  });
  t.equal(message.type, 'message');
  t.equal(h.upstream.received.at(-1)!.headers['x-api-key'], PLATFORM_KEY);
  const replayed = await client.models.list().then(
    () => null,
    (err: unknown) => err,
  );
  t.type(
    replayed,
    Anthropic.AuthenticationError,
    'the same header on another route: refused (it names POST /v1/messages)',
  );
});

t.test('a llmproxy without --gateway-key refuses the header, whatever else the request holds', async (t) => {
  const plain: Harness = await startHarness();
  t.teardown(() => plain.close());
  const r = await plain.call('/v1/messages', {
    headers: {
      'content-type': 'application/json',
      [GATEWAY_IDENTITY_HEADER]: await vouch(),
      'x-api-key': await plain.token(),
    },
    body: anthropicBody('hi'),
  });
  t.equal(r.status, 401);
  t.equal(plain.upstream.received.length, 0);
  t.ok(
    plain.logs.some(
      (l) => l.reason === 'gateway' && /no --gateway-key/.test(String((l.err as { message?: string })?.message)),
    ),
  );
});

t.test('--gateway-key: only the key, the private PEM too; a bad file refuses the start', async (t) => {
  const start = (gatewayKey: string) =>
    startLlmProxy({
      addr: '127.0.0.1:0',
      tlsCert: join(h.dir, 'server.pem'),
      tlsKey: join(h.dir, 'server-key.pem'),
      gatewayKey,
    });
  const fromPrivate = await start(key.privatePath);
  await fromPrivate.close();
  t.pass('the private PEM: its public key verifies, and --gateway-key alone lets agents in');
  await t.rejects(start(join(dir, 'missing.pem')), OptionsError);
  await t.rejects(start(h.dir + '/ca.pem'), { name: 'OptionsError', message: /a CERTIFICATE block is not a key/ });
});
