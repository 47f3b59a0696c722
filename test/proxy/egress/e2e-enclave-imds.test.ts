import { execFile } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { startBrokerHarness } from '../../fixtures/broker-harness.ts';
import { until } from '../../fixtures/eventually.ts';
import { addAgent } from '../../enclave/broker/secrets-fixture.ts';
import { destinationCa, interceptionCa, startDestination, startDvx } from './e2e-enclave-fixture.ts';
import { curl, startGatewayHarness, viaGateway } from './gateway-harness.ts';

// P11 end to end: `dvx serve imds` (the real binary) beside the gateway, with the same --inject-cred
// rules and the same enclave broker. What the agent's process reads with `curl --unix-socket` is what the
// gateway adds to the agent's requests: the same value, under the same header, in the same format; a
// value rotated on the broker changes in both. imds also hands out the CA the agent trusts the gateway's
// interception with, which the agent then uses.

t.setTimeout(120_000);

const GITHUB_TOKEN = 'ghp_e2e-imds-and-gateway-0123456789';
const TEAM_KEY = 'team-key-of-group-g1-abcdef';
const ROTATED = 'ghp_e2e-rotated-for-both-9876543210';
const RULES = [
  'host=api.dest.test,header=Authorization,secret=github_token,format=Bearer {}',
  'host=api.dest.test,header=X-Team-Key,secret=team_key,format=key={}, v=1',
];

const dir = await mkdtemp(join(tmpdir(), 'dvx-e2e-imds-'));
t.teardown(() => rm(dir, { recursive: true, force: true }));

const b = await startBrokerHarness({ seedAdmin: ['admin-1'] }, [{ clientId: 'admin-1', org: 'org-1', human: true }]);
t.teardown(() => b.close());
const brokerCa = join(dir, 'broker-ca.pem');
await writeFile(brokerCa, b.tls.ca.certPem);
await addAgent(b, 'agent-1', 'org-1', 'g-1');
const put = (name: string, value: string, q: string) =>
  b.operator('admin-1', 'PUT', `/api/v1/secrets/${encodeURIComponent(name)}${q}`, { value });
// The agent's own secret and its group's: the broker merges them for the agent.
for (const [name, value, q] of [
  ['github_token', GITHUB_TOKEN, '?agent=agent-1'],
  ['team_key', TEAM_KEY, '?group=g-1'],
])
  if ((await put(name, value, q)).status !== 200) throw new Error(`secret ${name} not set`);
const satellite = join(b.dir, 'state', 'satellite-token');

const icp = await interceptionCa(dir);
const dca = await destinationCa(dir);
const dest = await startDestination(dca.ca, ['api.dest.test']);
t.teardown(() => dest.close());

const h = await startGatewayHarness({
  resolve: { 'api.dest.test': ['127.0.0.1'] },
  gateway: {
    secretBrokerUrl: `https://127.0.0.1:${b.broker.agentPort}`,
    secretBrokerTokenFile: satellite,
    brokerCa,
    caCert: icp.certFile,
    caKey: icp.keyFile,
    upstreamCa: dca.file,
    injectCred: RULES,
  },
});
t.teardown(() => h.close());

const socket = join(dir, 'run', 'imds.sock');
const imds = await startDvx(
  [
    'serve',
    'imds',
    '--agent-id',
    'agent-1',
    '--org-id',
    'org-1',
    '--imds-socket',
    socket,
    '--imds-ca-cert',
    icp.certFile,
    '--secret-broker-url',
    `https://127.0.0.1:${b.broker.agentPort}`,
    '--secret-broker-token-file',
    satellite,
    '--broker-ca',
    brokerCa,
    ...RULES.flatMap((r) => ['--inject-cred', r]),
  ],
  'imds listening',
);
t.teardown(() => imds.stop());

/** `curl --unix-socket` as the agent's process reads imds: status and body. */
function imdsGet(path: string): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) =>
    execFile(
      'curl',
      ['-sS', '--max-time', '10', '--unix-socket', socket, '-w', '\n%{http_code}', `http://imds${path}`],
      (err, stdout, stderr) => {
        if (err) return reject(new Error(`curl failed: ${stderr || err.message}`));
        const cut = stdout.lastIndexOf('\n');
        resolve({ status: Number(stdout.slice(cut + 1)), body: stdout.slice(0, cut) });
      },
    ),
  );
}

/** The agent's request through the gateway, trusting the CA file imds handed out; what the destination got. */
async function throughGateway(path: string) {
  const caFromImds = await imdsGet('/v1/ca');
  if (caFromImds.status !== 200) throw new Error(`/v1/ca: ${caFromImds.status}`);
  await writeFile(join(dir, 'ca-from-imds.pem'), caFromImds.body);
  const res = await curl([
    ...viaGateway(h, await h.token()),
    '--cacert',
    join(dir, 'ca-from-imds.pem'),
    `https://api.dest.test:${dest.port}${path}`,
  ]);
  if (res.code !== 0) throw new Error(`curl through the gateway: ${res.stderr}`);
  const got = dest.received.at(-1)!;
  if (got.url !== path) throw new Error(`the destination did not get ${path}`);
  return got;
}

t.test('imds hands out the credential the gateway injects: same header, format and value', async (t) => {
  const cred = await imdsGet('/v1/credentials/github_token');
  t.equal(cred.status, 200, 'imds answers');
  t.same(JSON.parse(cred.body), {
    name: 'github_token',
    header: 'authorization',
    value: `Bearer ${GITHUB_TOKEN}`,
    hosts: ['api.dest.test'],
  });
  const team = JSON.parse((await imdsGet('/v1/credentials/team_key')).body);
  t.same(team, { name: 'team_key', header: 'x-team-key', value: `key=${TEAM_KEY}, v=1`, hosts: ['api.dest.test'] });

  const got = await throughGateway('/same');
  t.same(got.authorizations, [JSON.parse(cred.body).value], 'the gateway sent what imds hands out');
  t.equal(got.headers[team.header], team.value, 'for every rule of the host');

  t.match(
    imds.lines.find((l) => l.table === 'audit_events' && l.action === 'credential.read'),
    { actor: 'agent:agent-1', outcome: 'allow', resource: 'secret:github_token', source: 'imds' },
    'imds recorded the read',
  );
  t.ok(
    h.audit.some((r) => r.action === 'credential.inject' && (r.attrs as Record<string, string>).secret === 'team_key'),
    'the gateway recorded the injection',
  );
  for (const v of [GITHUB_TOKEN, TEAM_KEY]) {
    t.notOk(JSON.stringify(imds.lines).includes(v), 'no value in an imds log line or record');
    t.notOk((JSON.stringify(h.audit) + JSON.stringify(h.logs)).includes(v), 'nor in the gateway records and logs');
  }
});

t.test('a value rotated on the broker: both follow it', async (t) => {
  t.equal((await put('github_token', ROTATED, '?agent=agent-1')).status, 200);
  t.ok(
    await until(
      async () => JSON.parse((await imdsGet('/v1/credentials/github_token')).body).value === `Bearer ${ROTATED}`,
      15_000,
    ),
    'imds',
  );
  t.ok(
    await until(async () => (await throughGateway('/rotated')).authorizations[0] === `Bearer ${ROTATED}`, 15_000),
    'the gateway',
  );
});

t.test('a secret removed on the broker: imds has none to hand out, the gateway refuses to send bare', async (t) => {
  const removed = await b.operator('admin-1', 'DELETE', '/api/v1/secrets/team_key?group=g-1');
  t.equal(removed.status, 204);
  t.ok(await until(async () => (await imdsGet('/v1/credentials/team_key')).status === 404, 15_000), 'imds: 404');
  t.match(JSON.parse((await imdsGet('/v1/credentials/team_key')).body), {
    error: { type: 'not_found_error', message: /"team_key"/ },
  });
  const before = dest.received.length;
  const res = await curl([
    ...viaGateway(h, await h.token()),
    '--cacert',
    icp.certFile,
    '-w',
    '\n%{http_code}',
    `https://api.dest.test:${dest.port}/bare`,
  ]);
  t.equal(res.stdout.slice(res.stdout.lastIndexOf('\n') + 1), '403', 'the gateway: 403');
  t.match(JSON.parse(res.stdout.slice(0, res.stdout.lastIndexOf('\n'))), {
    error: { type: 'credential_unavailable', message: /"team_key"/ },
  });
  t.equal(dest.received.length, before, 'nothing reached the destination');
  t.equal((await imdsGet('/v1/credentials/github_token')).status, 200, 'the other credential is still handed out');
});
