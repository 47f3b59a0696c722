import t from 'tap';
import https from 'node:https';
import { createServer, type AddressInfo } from 'node:net';
import { readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { issueCertificate } from '../../../core/tls.ts';
import { startLlmProxy } from '../../../proxy/llm/server.ts';
import { validateOptions } from '../../../proxy/llm/options.ts';
import { parseSatelliteSecrets } from '../../../proxy/llm/secret-broker.ts';
import { startBrokerHarness, type BrokerHarness } from '../../fixtures/broker-harness.ts';
import { until } from '../../fixtures/eventually.ts';
import { anthropicBody, baseSnapshot, post, startHarness, type Harness } from '../../fixtures/llmproxy-harness.ts';
import { runDvx } from '../../fixtures/run-dvx.ts';
import { addAgent } from '../../enclave/broker/secrets-fixture.ts';

// llmproxy with `--secret-broker-url`: a real broker (its operator listener behind a real OIDC issuer,
// its satellite routes over TLS) holds the secrets, a real llmproxy reads them with the satellite token
// and follows the broker's events, and a real upstream shows which key each call carried.

const ORG_KEY_1 = 'sk-broker-org-key-one-0123';
const ORG_KEY_2 = 'sk-broker-org-key-two-4567';
const AGENT_KEY = 'sk-broker-agent-key-89ab';
const AGENT_KEY_2 = 'sk-broker-agent-key-cdef';
const GROUP_KEY = 'sk-broker-group-key-0246';
const DB_PASSWORD = 'broker-held-db-password';
const VALUES = [ORG_KEY_1, ORG_KEY_2, AGENT_KEY, AGENT_KEY_2, GROUP_KEY, DB_PASSWORD];

const freePort = () =>
  new Promise<number>((resolve) => {
    const s = createServer().listen(0, '127.0.0.1', () => {
      const { port } = s.address() as AddressInfo;
      s.close(() => resolve(port));
    });
  });

async function broker(port: number, tokenFile?: string): Promise<BrokerHarness & { caFile: string }> {
  const h = await startBrokerHarness(
    { addr: `127.0.0.1:${port}`, seedAdmin: ['admin-1'], ...(tokenFile ? { satelliteTokenFile: tokenFile } : {}) },
    [{ clientId: 'admin-1', org: 'org-1', human: true }],
  );
  const caFile = join(h.dir, 'broker-ca.pem');
  await writeFile(caFile, h.tls.ca.certPem);
  await addAgent(h, 'agent-1', 'org-1', 'g-1');
  await addAgent(h, 'agent-2', 'org-1', 'g-2');
  return Object.assign(h, { caFile });
}

const snapshot = (upstream: string) => {
  const s = baseSnapshot(upstream) as { agents: Record<string, unknown> };
  s.agents['agent-2'] = {
    org_id: 'org-1',
    group_id: 'g-2',
    name: 'two',
    status: 'active',
    contained: false,
    config: {},
  };
  return s;
};

const put = (b: BrokerHarness, name: string, value: string, q = '') =>
  b.operator('admin-1', 'PUT', `/api/v1/secrets/${encodeURIComponent(name)}${q}`, { value });

/** The key the upstream saw on a call of `agent` (null when the proxy did not forward it). */
async function keyOf(p: Harness, agent: 'agent-1' | 'agent-2'): Promise<string | null> {
  const before = p.upstream.received.length;
  const res = await post(
    p,
    '/v1/messages',
    anthropicBody('hi'),
    {},
    { sub: agent, group_id: agent === 'agent-1' ? 'g-1' : 'g-2' },
  );
  if (res.status !== 200 || p.upstream.received.length === before) return null;
  return String(p.upstream.received.at(-1)!.headers['x-api-key']);
}

t.test('the broker holds the keys; llmproxy follows every change', async (t) => {
  const port = await freePort();
  const b = await broker(port);
  t.teardown(() => b.close());
  t.equal((await put(b, 'llmproxy:llm.api_key', ORG_KEY_1)).status, 200);

  const p = await startHarness({
    snapshot,
    proxy: {
      secretsFile: '',
      secretBrokerUrl: `https://127.0.0.1:${port}`,
      secretBrokerTokenFile: join(b.dir, 'state', 'satellite-token'),
      brokerCa: b.caFile,
    },
  });
  t.teardown(() => p.close());

  t.equal(await keyOf(p, 'agent-2'), ORG_KEY_1, 'the org key the broker holds, loaded at start');

  // The operator changes it: the next calls carry the new key within moments (the broker's event, not
  // the 30-second safety net).
  t.equal((await put(b, 'llmproxy:llm.api_key', ORG_KEY_2)).status, 200);
  t.ok(await until(async () => (await keyOf(p, 'agent-2')) === ORG_KEY_2, 3000), 'the new org key, event-driven');

  // An agent-scope key beats the org's; a group-scope key beats the org's for that group's agents.
  t.equal((await put(b, 'agent:llmproxy.llm.api_key', AGENT_KEY, '?agent=agent-1')).status, 200);
  t.ok(await until(async () => (await keyOf(p, 'agent-1')) === AGENT_KEY, 3000), "agent-1's own key");
  t.equal(await keyOf(p, 'agent-2'), ORG_KEY_2, 'agent-2 keeps the org key');
  t.equal((await put(b, 'llmproxy:llm.api_key', GROUP_KEY, '?group=g-2')).status, 200);
  t.ok(await until(async () => (await keyOf(p, 'agent-2')) === GROUP_KEY, 3000), "agent-2's group key");
  t.equal(await keyOf(p, 'agent-1'), AGENT_KEY, 'agent-1 keeps its own');

  // The secrets filter's needles come from the broker: an agent's own secret in a request is found.
  const leak = () => post(p, '/v1/messages', anthropicBody(`the password is ${DB_PASSWORD}`));
  t.equal((await leak()).status, 200, 'not a secret of the agent yet');
  t.equal((await put(b, 'db_password', DB_PASSWORD, '?agent=agent-1')).status, 200);
  t.ok(await until(async () => (await leak()).status === 403, 3000), 'blocked once the broker holds it');
  t.match(p.audit.at(-1), { findings: [{ inspector_type: 'secrets', location: 'request_body' }] });

  // The broker stops: llmproxy keeps the last good copy. It comes back: llmproxy reconnects and follows.
  await b.broker.close();
  t.equal(await keyOf(p, 'agent-1'), AGENT_KEY, 'served from the last good copy while the broker is down');
  await b.restart();
  t.equal((await put(b, 'agent:llmproxy.llm.api_key', AGENT_KEY_2, '?agent=agent-1')).status, 200);
  t.ok(await until(async () => (await keyOf(p, 'agent-1')) === AGENT_KEY_2, 25_000), 'followed after a reconnect');
  t.equal(
    (await b.operator('admin-1', 'DELETE', '/api/v1/secrets/agent%3Allmproxy.llm.api_key?agent=agent-1')).status,
    204,
  );
  t.ok(await until(async () => (await keyOf(p, 'agent-1')) === ORG_KEY_2, 3000), 'deleted: back to the org key');

  // No value in any log line of either, nor in any audit record of either (the proxy's findings carry a
  // redacted prefix only).
  for (const v of VALUES) {
    t.notOk(b.logs.join('\n').includes(v), 'not in a broker log line');
    t.notOk(JSON.stringify(b.audit).includes(v), 'not in a broker audit record');
    t.notOk(JSON.stringify(p.logs).includes(v), 'not in an llmproxy log line');
    t.notOk(JSON.stringify(p.audit).includes(v), 'not in an llmproxy audit record');
  }
  t.notOk(
    JSON.stringify(p.logs).includes((await readFile(join(b.dir, 'state', 'satellite-token'), 'utf8')).trim()),
    'nor the satellite token',
  );
});

t.test('a broker unreachable at start: llmproxy serves, says so, and picks the keys up once it answers', async (t) => {
  // A broker started once (its satellite token and CA exist), then stopped: its port answers nothing.
  const port = await freePort();
  const b = await broker(port);
  t.teardown(() => b.close());
  await b.broker.close();

  const p = await startHarness({
    snapshot,
    proxy: {
      secretsFile: '',
      secretBrokerUrl: `https://127.0.0.1:${port}`,
      secretBrokerTokenFile: join(b.dir, 'state', 'satellite-token'),
      brokerCa: b.caFile,
    },
  });
  t.teardown(() => p.close());
  t.ok(
    p.logs.some((l) => /secret broker unreachable/.test(String(l.msg)) && l.level === 'error'),
    'an error logged at start',
  );
  const none = await post(p, '/v1/messages', anthropicBody('hi'), {}, { sub: 'agent-2', group_id: 'g-2' });
  t.equal(none.status, 500);
  t.match(JSON.parse(none.text), { error: { message: 'no LLM API credential configured' } });

  await b.restart();
  t.equal((await put(b, 'llmproxy:llm.api_key', ORG_KEY_1)).status, 200);
  t.ok(await until(async () => (await keyOf(p, 'agent-2')) === ORG_KEY_1, 20_000), 'the key once the broker answers');
  t.ok(p.logs.some((l) => l.msg === 'secrets loaded from the secret broker'));
});

t.test('an https --agent-jwks is fetched trusting --broker-ca', async (t) => {
  const b = await startBrokerHarness();
  t.teardown(() => b.close());
  const caFile = join(b.dir, 'broker-ca.pem');
  await writeFile(caFile, b.tls.ca.certPem);
  const leaf = await issueCertificate(b.tls.ca, { commonName: 'localhost', ipAddresses: ['127.0.0.1'] });
  let jwks: unknown = { keys: [] };
  const server = https.createServer({ cert: leaf.certPem, key: leaf.keyPem }, (_req, res) => {
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify(jwks));
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  t.teardown(() => new Promise<void>((r) => server.close(() => r())));
  const url = `https://127.0.0.1:${(server.address() as AddressInfo).port}/.well-known/jwks.json`;

  const trusted = await startHarness({ proxy: { agentJwks: url, brokerCa: caFile } });
  t.teardown(() => trusted.close());
  jwks = trusted.issuer.jwks;
  t.equal((await post(trusted, '/v1/messages', anthropicBody('hi'))).status, 200, 'verified against the remote JWKS');

  const untrusted = await startHarness({ proxy: { agentJwks: url } });
  t.teardown(() => untrusted.close());
  jwks = untrusted.issuer.jwks;
  t.equal(
    (await post(untrusted, '/v1/messages', anthropicBody('hi'))).status,
    401,
    'without --broker-ca the JWKS host is not trusted',
  );
});

t.test('options: one secret source, an https broker, its token', async (t) => {
  const base = { tlsCert: 'c', tlsKey: 'k', agentJwks: 'j' };
  t.throws(
    () => validateOptions({ ...base, secretsFile: 's.json', secretBrokerUrl: 'https://b', secretBrokerTokenFile: 't' }),
    /--secrets-file and --secret-broker-url .* choose one/,
  );
  t.throws(() => validateOptions({ ...base, secretBrokerUrl: 'https://b' }), /--secret-broker-token-file/);
  t.throws(
    () => validateOptions({ ...base, secretBrokerUrl: 'http://b', secretBrokerTokenFile: 't' }),
    /must be https/,
  );
  t.throws(
    () => validateOptions({ ...base, secretBrokerUrl: 'b:/x', secretBrokerTokenFile: 't' }),
    /must be https|absolute/,
  );
  t.throws(() => validateOptions({ ...base, secretBrokerTokenFile: 't' }), /--secret-broker-url, which is not set/);
  t.equal(
    validateOptions({ ...base, secretBrokerUrl: 'https://b:8450/', secretBrokerTokenFile: 't' }).secretBrokerUrl,
    'https://b:8450',
  );

  const h = await startHarness();
  t.teardown(() => h.close());
  await t.rejects(
    startLlmProxy({
      addr: '127.0.0.1:0',
      tlsCert: join(h.dir, 'server.pem'),
      tlsKey: join(h.dir, 'server-key.pem'),
      agentJwks: join(h.dir, 'jwks.json'),
      secretBrokerUrl: 'https://127.0.0.1:1',
      secretBrokerTokenFile: join(h.dir, 'no-such-token'),
    }),
    /cannot read --secret-broker-token-file .*ENOENT/,
    'a token file that cannot be read refuses the start',
  );

  const cli = await runDvx([
    'serve',
    'llmproxy',
    '--tls-cert',
    'c',
    '--tls-key',
    'k',
    '--agent-jwks',
    'j',
    '--secrets-file',
    's.json',
    '--secret-broker-url',
    'https://broker:8450',
    '--secret-broker-token-file',
    't',
  ]);
  t.equal(cli.code, 2);
  t.match(cli.stderr, /--secrets-file and --secret-broker-url are two sources of the same secrets: choose one/);
  const help = (await runDvx(['serve', 'llmproxy', '--help'])).stdout.replace(/\s+/g, ' ');
  for (const flag of ['SECRET_BROKER_URL', 'SECRET_BROKER_TOKEN_FILE', 'BROKER_CA']) t.match(help, `env: DVX_${flag}`);
});

t.test('the broker document is checked before it replaces the copy', async (t) => {
  const ok = parseSatelliteSecrets({ version: 3, agents: { a: { k: 'v' } }, orgs: { o: { k2: 'v2' } } });
  t.equal(ok.version, 3);
  t.same([...ok.map.keys()], ['agent:a', 'org:o']);
  t.equal(ok.map.get('agent:a')!.get('k'), 'v');
  for (const [doc, message] of [
    [null, /not a JSON object/],
    [{ agents: {}, orgs: {} }, /lack a version/],
    [{ version: -1, agents: {}, orgs: {} }, /lack a version/],
    [{ version: 1, orgs: {} }, /lack "agents"/],
    [{ version: 1, agents: { a: [] }, orgs: {} }, /agent a are not an object/],
    [{ version: 1, agents: { a: { k: 1 } }, orgs: {} }, /secret k of agent a is not a string/],
  ] as const)
    t.throws(() => parseSatelliteSecrets(doc), message);
  // A value in a refused document never shows in the error.
  t.throws(() => parseSatelliteSecrets({ version: 1, agents: { a: { k: 'visible-value' } }, orgs: 'x' }), {
    message: /^(?!.*visible-value)/,
  });
});
