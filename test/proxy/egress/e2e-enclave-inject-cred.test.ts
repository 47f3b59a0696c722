import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { ProxyAgent, request } from 'undici';
import { startBrokerHarness } from '../../fixtures/broker-harness.ts';
import { until } from '../../fixtures/eventually.ts';
import { addAgent } from '../../enclave/broker/secrets-fixture.ts';
import { destinationCa, interceptionCa, sha256, startDestination } from './e2e-enclave-fixture.ts';
import { baseSnapshot, curl, startGatewayHarness, viaGateway } from './gateway-harness.ts';

// P11 end to end: --inject-cred with the secrets of a real enclave broker. The broker (real TLS, its
// satellite routes, secrets authored on its operator listener by an enclave admin) is the gateway's
// --secret-broker-url; an agent's HTTPS request through the gateway (curl, undici's ProxyAgent, TLS
// intercepted with the gateway's CA) reaches a real https destination carrying the secret, in place of
// the agent's own Authorization. The agent is never handed the value, nor is any record or log line.
// Secrets set or rotated on the broker while the gateway runs apply to the next request; a rule whose
// secret the agent lacks refuses the request (403 credential_unavailable) and nothing reaches the
// destination.

t.setTimeout(120_000);

const GITHUB_TOKEN = 'ghp_e2e-broker-held-0123456789abcdef';
const ROTATED = 'ghp_e2e-rotated-by-admin-fedcba9876';
const VAULT_TOKEN = 'hvs.e2e-vault-set-while-running-42';
const AGENT_OWN = 'Bearer agent-own-authorization-1234';

const dir = await mkdtemp(join(tmpdir(), 'dvx-e2e-inject-'));
t.teardown(() => rm(dir, { recursive: true, force: true }));

const b = await startBrokerHarness({ seedAdmin: ['admin-1'] }, [{ clientId: 'admin-1', org: 'org-1', human: true }]);
t.teardown(() => b.close());
const brokerCa = join(dir, 'broker-ca.pem');
await writeFile(brokerCa, b.tls.ca.certPem);
await addAgent(b, 'agent-1', 'org-1', 'g-1');
await addAgent(b, 'agent-2', 'org-1', 'g-1');
const put = (name: string, value: string, q: string) =>
  b.operator('admin-1', 'PUT', `/api/v1/secrets/${encodeURIComponent(name)}${q}`, { value });
// No assertion before the first subtest: tap would end the file's root test (and run its teardowns) there.
if ((await put('github_token', GITHUB_TOKEN, '?agent=agent-1')).status !== 200) throw new Error('secret not set');

const icp = await interceptionCa(dir);
const dca = await destinationCa(dir);
const api = await startDestination(dca.ca, ['api.dest.test']);
t.teardown(() => api.close());
const vault = await startDestination(dca.ca, ['vault.dest.test']);
t.teardown(() => vault.close());

const h = await startGatewayHarness({
  snapshot: baseSnapshot({
    agents: {
      'agent-2': { org_id: 'org-1', group_id: 'g-1', name: 'two', status: 'active', contained: false, config: {} },
    },
  }),
  resolve: { 'api.dest.test': ['127.0.0.1'], 'vault.dest.test': ['127.0.0.1'] },
  gateway: {
    secretBrokerUrl: `https://127.0.0.1:${b.broker.agentPort}`,
    secretBrokerTokenFile: join(b.dir, 'state', 'satellite-token'),
    brokerCa,
    caCert: icp.certFile,
    caKey: icp.keyFile,
    upstreamCa: dca.file,
    injectCred: [
      'host=api.dest.test,header=Authorization,secret=github_token,format=Bearer {}',
      'host=vault.dest.test,header=Authorization,secret=vault_token,format=Bearer {}',
    ],
  },
});
t.teardown(() => h.close());

const proxies: ProxyAgent[] = [];
t.teardown(() => Promise.all(proxies.map((p) => p.close())));
/** An agent's undici client through the gateway: its JWT as proxy credential, trusting the interception CA. */
async function agentClient(sub = 'agent-1'): Promise<ProxyAgent> {
  const p = new ProxyAgent({
    uri: h.proxyUrl,
    token: `Bearer ${await h.token({ sub })}`,
    proxyTls: { ca: h.ca.certPem, servername: 'localhost' },
    requestTls: { ca: icp.ca.certPem },
  });
  proxies.push(p);
  return p;
}
const flows = () => h.audit.filter((r) => r.table === 'network_flow');
const events = () => h.audit.filter((r) => r.table === 'audit_events');
const flowOf = (path: string) =>
  flows()
    .filter((r) => String((r.attrs as Record<string, string> | undefined)?.url ?? '').endsWith(path))
    .at(-1);
const everything = () => JSON.stringify(h.audit) + JSON.stringify(h.logs);

t.test('curl through the gateway: the broker secret replaces the agent Authorization', async (t) => {
  const token = await h.token();
  const res = await curl([
    ...viaGateway(h, token),
    '--cacert',
    icp.certFile,
    '-H',
    `Authorization: ${AGENT_OWN}`,
    '-D',
    '-',
    `https://api.dest.test:${api.port}/repos`,
  ]);
  t.equal(res.code, 0, res.stderr);
  const got = api.received.at(-1)!;
  t.equal(got.url, '/repos');
  t.same(got.authorizations, [`Bearer ${GITHUB_TOKEN}`], 'one Authorization: the secret, in the rule format');
  t.notOk(JSON.stringify(got.headers).includes('agent-own-authorization'), 'the agent own is gone');
  t.notOk('proxy-authorization' in got.headers, 'the proxy credential stops at the gateway');

  const body = JSON.parse(res.stdout.slice(res.stdout.lastIndexOf('\r\n\r\n') + 4));
  t.same(body.authorization_sha256, [sha256(`Bearer ${GITHUB_TOKEN}`)], 'the answer says what arrived');
  t.notOk(res.stdout.includes(GITHUB_TOKEN), 'the agent never sees the value: not in the answer, nor its headers');

  t.ok(await until(() => flowOf('/repos') !== undefined), 'the request network_flow record');
  const flow = flowOf('/repos')!;
  const attrs = flow.attrs as Record<string, string>;
  t.match(flow, {
    kind: 'network_flow',
    action: 'http.request',
    proto: 'https',
    actor: 'agent:agent-1',
    dst_host: 'api.dest.test',
    dst_port: api.port,
    outcome: 'allow',
  });
  t.equal(attrs.status, '200');
  t.equal(attrs.injected_headers, 'authorization');
  t.type(attrs.request_headers, 'string', 'headers captured');
  t.notMatch(attrs.request_headers, /authorization/i, 'neither the injected nor the agent own Authorization recorded');
  t.notOk(attrs.request_headers.includes(GITHUB_TOKEN));

  const inject = events().find((e) => e.action === 'credential.inject' && e.trace_id === flow.id);
  t.match(
    inject,
    {
      kind: 'event',
      actor: 'agent:agent-1',
      actor_kind: 'agent',
      agent_id: 'agent-1',
      org_id: 'org-1',
      outcome: 'allow',
      source: 'gateway',
      resource: `api.dest.test:${api.port}`,
      attrs: { secret: 'github_token', header: 'authorization', host: 'api.dest.test', flow_id: flow.id },
    },
    'the credential.inject record, tied to the flow',
  );
  t.notOk(JSON.stringify(inject).includes(GITHUB_TOKEN), 'no value in it');
  t.notOk(everything().includes(GITHUB_TOKEN), 'the value is in no record and no log line');
  t.notOk(everything().includes('agent-own-authorization'), 'nor the agent own Authorization');
});

t.test('a destination that hands the credential back: its record is redacted', async (t) => {
  const agent = await agentClient();
  const res = await request(`https://api.dest.test:${api.port}/echo`, { dispatcher: agent });
  t.equal(res.statusCode, 200);
  // The gateway relays answers as they come: a destination echoing a credential is the operator's to avoid.
  t.equal(await res.body.text(), `you sent Bearer ${GITHUB_TOKEN}`);
  t.ok(await until(() => flowOf('/echo') !== undefined));
  t.equal((flowOf('/echo')!.attrs as Record<string, string>).response_body, 'you sent [REDACTED]');
  t.notOk(everything().includes(GITHUB_TOKEN));
});

t.test('a value rotated on the broker while the gateway runs is the next one sent', async (t) => {
  t.equal((await put('github_token', ROTATED, '?agent=agent-1')).status, 200);
  const agent = await agentClient();
  const sent = async () => {
    const res = await request(`https://api.dest.test:${api.port}/rotated`, { dispatcher: agent });
    const body = (await res.body.json()) as { authorization_sha256: string[] };
    return body.authorization_sha256[0];
  };
  t.ok(await until(async () => (await sent()) === sha256(`Bearer ${ROTATED}`), 15_000), 'the rotated value arrives');
  t.same(api.received.at(-1)!.authorizations, [`Bearer ${ROTATED}`]);
  t.notOk(everything().includes(ROTATED), 'never recorded either');
});

t.test('a secret the agent lacks: 403 credential_unavailable, the destination never contacted', async (t) => {
  const agent = await agentClient();
  const missing = await request(`https://vault.dest.test:${vault.port}/v1/kv`, {
    dispatcher: agent,
    method: 'POST',
    body: '{"path":"x"}',
    headers: { authorization: AGENT_OWN, 'content-type': 'application/json' },
  });
  t.equal(missing.statusCode, 403);
  const body = (await missing.body.json()) as { type: string; error: { type: string; message: string } };
  t.equal(body.error.type, 'credential_unavailable');
  t.match(body.error.message, /vault\.dest\.test.*"vault_token"/, 'names the rule host and the secret');
  t.equal(vault.connections, 0, 'no connection to the destination');
  t.equal(vault.received.length, 0, 'no request');
  t.ok(await until(() => flowOf('/v1/kv') !== undefined));
  t.match(flowOf('/v1/kv'), { outcome: 'deny', reason: /credential unavailable/ });
  t.notOk(
    events().some((e) => (e.attrs as Record<string, string>).secret === 'vault_token'),
    'no injection recorded',
  );

  // Another agent of the org, without github_token of its own (the secret is agent-1's): refused too.
  const before = api.received.length;
  const other = await request(`https://api.dest.test:${api.port}/not-mine`, {
    dispatcher: await agentClient('agent-2'),
  });
  t.equal(other.statusCode, 403);
  t.match(await other.body.json(), { error: { type: 'credential_unavailable' } });
  t.equal(api.received.length, before, 'agent-1 secret is not lent to agent-2');
});

t.test('a secret set on the broker while the gateway runs is picked up', async (t) => {
  t.equal((await put('vault_token', VAULT_TOKEN, '?agent=agent-1')).status, 200);
  const agent = await agentClient();
  t.ok(
    await until(async () => {
      const res = await request(`https://vault.dest.test:${vault.port}/v1/kv`, { dispatcher: agent });
      await res.body.text();
      return res.statusCode === 200;
    }, 15_000),
    'the request goes through once the broker has it',
  );
  t.same(vault.received.at(-1)!.authorizations, [`Bearer ${VAULT_TOKEN}`]);
  t.notOk(everything().includes(VAULT_TOKEN));
});
