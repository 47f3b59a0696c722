import t from 'tap';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { generateKeyPairSync } from 'node:crypto';
import net from 'node:net';
import tls from 'node:tls';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { request } from 'undici';
import { createLogger } from '../../../core/logger.ts';
import { issueCertificate } from '../../../core/tls.ts';
import type { AgentIdentity } from '../../../proxy/llm/auth.ts';
import { GATEWAY_IDENTITY_HEADER } from '../../../proxy/llm/gateway-identity.ts';
import { trusting } from '../../../proxy/egress/ca-bundle.ts';
import { GatewayOptionsError, GatewayRuleError } from '../../../proxy/egress/errors.ts';
import { openLlmproxyRoute } from '../../../proxy/egress/llmproxy-route.ts';
import { validateGatewayOptions, type GatewayOptions } from '../../../proxy/egress/options.ts';
import { gatewayKey } from '../../fixtures/gateway-key.ts';
import { anthropicBody, PLATFORM_KEY, recordAfter, startHarness } from '../../fixtures/llmproxy-harness.ts';

// The gateway's route to llmproxy, against a real llmproxy (--gateway-key: the public key) and its
// upstream: the request sent as the exchange sends it (origin, dispatcher, the route's headers over the
// agent's) is governed as the agent's; the hosts it matches; the keys and addresses it refuses to start
// with; and the bounds of its dispatcher (a llmproxy that never finishes a handshake, or never answers).

const dir = await mkdtemp(join(tmpdir(), 'dvx-llmproxy-route-'));
t.teardown(() => rm(dir, { recursive: true, force: true }));
const key = await gatewayKey(dir);
const h = await startHarness({ proxy: { gatewayKey: key.publicPath } });
t.teardown(() => h.close());
const log = createLogger({ level: 'error', destination: { write: () => {} } });

const options = (over: Partial<GatewayOptions> = {}) =>
  validateGatewayOptions({
    tlsCert: 'unused.pem',
    tlsKey: 'unused.pem',
    agentJwks: 'unused.json',
    llmproxyAddr: h.url,
    gatewayKey: key.privatePath,
    upstreamCa: join(h.dir, 'ca.pem'),
    ...over,
  });
const agent: AgentIdentity = {
  agentId: 'agent-1',
  orgId: 'org-1',
  agentName: 'builder',
  groupId: 'g-1',
  via: 'mtls',
  tokenHeader: null,
};

t.test('a routed request reaches the upstream through llmproxy, as the agent', async (t) => {
  const route = await openLlmproxyRoute(options(), log);
  t.teardown(() => route.close());
  const before = h.audit.length;
  const upstream = await route.route(agent, 'POST', '/v1/messages?beta=true');
  t.equal(upstream.origin, h.url);
  t.same(Object.keys(upstream.headers), [GATEWAY_IDENTITY_HEADER]);
  const res = await request(`${upstream.origin}/v1/messages?beta=true`, {
    method: 'POST',
    dispatcher: upstream.dispatcher,
    headers: {
      'content-type': 'application/json',
      'x-api-key': 'sk-dummy',
      ...upstream.headers,
    },
    body: anthropicBody('hello'),
  });
  t.equal(res.statusCode, 200, await res.body.text());
  const got = h.upstream.received.at(-1)!;
  t.equal(got.path, '/v1/messages?beta=true');
  t.equal(got.headers['x-api-key'], PLATFORM_KEY);
  t.match(await recordAfter(h, before), { agent_id: 'agent-1', org_id: 'org-1', status: 200 });

  // Signed for one request: the same headers on another path are refused by llmproxy.
  const replay = await request(`${upstream.origin}/v1/chat/completions`, {
    method: 'POST',
    dispatcher: upstream.dispatcher,
    headers: { 'content-type': 'application/json', ...upstream.headers },
    body: JSON.stringify({ model: 'gpt-4o', messages: [] }),
  });
  t.equal(replay.statusCode, 401);
  await replay.body.dump();
});

t.test('matches: --llm-host globs, the defaults without them', async (t) => {
  const defaults = await openLlmproxyRoute(options(), log);
  t.teardown(() => defaults.close());
  for (const host of ['api.anthropic.com', 'API.OpenAI.com', 'api.anthropic.com.']) t.ok(defaults.matches(host), host);
  for (const host of ['anthropic.com', 'api.anthropic.com.evil.test', 'evil.test', 'xapi.openai.com'])
    t.notOk(defaults.matches(host), host);
  const globbed = await openLlmproxyRoute(options({ llmHost: ['*.llm.corp', 'models.example'] }), log);
  t.teardown(() => globbed.close());
  t.ok(globbed.matches('a.llm.corp'));
  t.ok(globbed.matches('models.example'));
  t.notOk(globbed.matches('llm.corp'));
  t.notOk(globbed.matches('api.anthropic.com'), 'the given hosts replace the defaults');
  await t.rejects(openLlmproxyRoute(options({ llmHost: ['bad host!'] }), log), GatewayRuleError);
});

t.test('the start is refused: an unusable --gateway-key, a path on --llmproxy-addr, a missing CA', async (t) => {
  const rsa = join(dir, 'rsa.pem');
  await writeFile(
    rsa,
    generateKeyPairSync('rsa', { modulusLength: 2048 }).privateKey.export({ type: 'pkcs8', format: 'pem' }),
  );
  const cases: [string, Partial<GatewayOptions>, RegExp][] = [
    ['unreadable key', { gatewayKey: join(dir, 'none.pem') }, /cannot read --gateway-key .*none\.pem: ENOENT/],
    ['a public key', { gatewayKey: key.publicPath }, /must hold one EC P-256 private key/],
    ['an RSA key', { gatewayKey: rsa }, /not an EC P-256 key/],
    ['a base path', { llmproxyAddr: `${h.url}/proxy` }, /without a path/],
    ['an unreadable --upstream-ca', { upstreamCa: join(dir, 'none-ca.pem') }, /cannot read --upstream-ca/],
  ];
  for (const [name, over, message] of cases)
    await t.rejects(openLlmproxyRoute(options(over), log), { name: GatewayOptionsError.name, message }, name);
});

t.test('TLS to llmproxy: --upstream-ca added to the system roots, which alone do not trust a private CA', async (t) => {
  const extra = Buffer.from(h.ca.certPem);
  const ca = trusting(extra).ca!;
  t.equal(ca.length, tls.rootCertificates.length + 1, 'every system root, and the bundle');
  t.same(trusting(undefined), {}, 'no bundle: the system roots (the default)');
  const route = await openLlmproxyRoute(options({ upstreamCa: '' }), log);
  t.teardown(() => route.close());
  const upstream = await route.route(agent, 'GET', '/v1/models');
  await t.rejects(
    request(`${upstream.origin}/v1/models`, { dispatcher: upstream.dispatcher, headers: upstream.headers }),
    /certificate/,
  );
});

t.test('bounded: a llmproxy that never finishes the handshake, or never answers', async (t) => {
  // Accepts, and says nothing: the TLS handshake never completes.
  const silent = net.createServer(() => {});
  await new Promise<void>((resolve) => silent.listen(0, '127.0.0.1', resolve));
  t.teardown(() => {
    silent.close();
  });
  const sockets = new Set<net.Socket>();
  silent.on('connection', (s) => sockets.add(s));
  t.teardown(() => {
    for (const s of sockets) s.destroy();
  });
  const port = (silent.address() as net.AddressInfo).port;
  const route = await openLlmproxyRoute(options({ llmproxyAddr: `127.0.0.1:${port}`, connectTimeout: 300 }), log);
  t.teardown(() => route.close());
  const up = await route.route(agent, 'GET', '/v1/models');
  await t.rejects(request(`${up.origin}/v1/models`, { dispatcher: up.dispatcher, headers: up.headers }), {
    code: 'UND_ERR_CONNECT_TIMEOUT',
  });

  // Completes TLS, reads the request, never answers.
  const leaf = await issueCertificate(h.ca, { commonName: 'localhost', ipAddresses: ['127.0.0.1'] });
  const mute = tls.createServer({ cert: leaf.certPem, key: leaf.keyPem }, (s) => {
    sockets.add(s);
    s.resume();
  });
  await new Promise<void>((resolve) => mute.listen(0, '127.0.0.1', resolve));
  t.teardown(() => {
    mute.close();
  });
  const mutePort = (mute.address() as net.AddressInfo).port;
  const slow = await openLlmproxyRoute(
    options({ llmproxyAddr: `https://127.0.0.1:${mutePort}`, upstreamTimeout: 300 }),
    log,
  );
  t.teardown(() => slow.close());
  const up2 = await slow.route(agent, 'GET', '/v1/models');
  await t.rejects(request(`${up2.origin}/v1/models`, { dispatcher: up2.dispatcher, headers: up2.headers }), {
    code: 'UND_ERR_HEADERS_TIMEOUT',
  });
});
