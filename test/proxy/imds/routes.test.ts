import t from 'tap';
import { createConnection } from 'node:net';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { generateCa } from '../../../core/tls.ts';
import { writeFileAtomic } from '../../../core/atomic-file.ts';
import { configHash } from '../../../pipeline/policy/config-values.ts';
import { Agent, request } from 'undici';
import { until } from '../../fixtures/eventually.ts';
import { tlsDir } from '../../fixtures/tls-dir.ts';
import {
  configDocument,
  curl,
  get,
  GH_TOKEN,
  ORG_TOKEN,
  OTHER_AGENT_TOKEN,
  startHarness,
  tempDir,
} from './imds-fixture.ts';

// imds's routes over its real unix socket, read with curl --unix-socket and node's http client: the
// agent's config (merged, hashed, reloaded when the snapshot changes), the rules, a credential's value
// and its 404, and what is refused (other methods, unknown paths, prototype names, bodies).

t.test('GET /v1/config: the agent merged platform → org → group → agent, with locks and a hash', async (t) => {
  const h = await startHarness(t);
  const res = await curl(h.socket, '/v1/config');
  t.equal(res.status, 200);
  const body = JSON.parse(res.body);
  const config = { 'log.level': 'info', region: 'eu', 'feature.x': true, team: 'ops' };
  t.same(body, {
    agent_id: 'agent-1',
    org_id: 'org-1',
    group_id: 'ops',
    version: 'v1',
    config,
    config_hash: configHash(config),
    secret_keys: ['api.token'],
  });
  t.notOk('api.token' in body.config, 'a key declared secret carries no value here');

  // The snapshot is replaced (the config-pull sidecar writes it atomically): the next read is the new one.
  await writeFileAtomic(h.configFile, JSON.stringify(configDocument('v2', 'ap')));
  t.ok(
    await until(async () => (await get(h.socket, '/v1/config')).json?.version === 'v2', 10_000),
    'reloaded after the file changed',
  );
  const after = (await get(h.socket, '/v1/config')).json;
  t.equal(after.config.region, 'ap', 'the new locked org value');
  t.not(after.config_hash, body.config_hash, 'the hash follows the config');

  // A broken write keeps the last good snapshot.
  await writeFile(h.configFile, '{"agents": [');
  t.ok(
    await until(() => h.logs.some((l) => l.includes('config snapshot reload refused')), 10_000),
    'the refused reload is logged',
  );
  t.equal((await get(h.socket, '/v1/config')).json.version, 'v2', 'still the last good one');
});

t.test('the agent is found by --org-id when the snapshot does not name it; a disagreement is refused', async (t) => {
  const unknown = await startHarness(t, { agentId: 'agent-9' });
  const r1 = await get(unknown.socket, '/v1/config');
  t.equal(r1.status, 404);
  t.match(r1.json, {
    type: 'error',
    error: { type: 'not_found_error', message: /agent-9 is not in the config snapshot/ },
  });

  const byFlag = await startHarness(t, { agentId: 'agent-9', orgId: 'org-1' });
  const r2 = await get(byFlag.socket, '/v1/config');
  t.equal(r2.status, 200);
  t.same(r2.json.config, { 'log.level': 'info', region: 'eu', 'feature.x': false }, 'platform and org only');

  const clash = await startHarness(t, { orgId: 'org-2' });
  const r3 = await get(clash.socket, '/v1/config');
  t.equal(r3.status, 503);
  t.match(r3.json.error, { type: 'config_unavailable', message: /org org-1.*org org-2/ });
});

t.test('without --config-snapshot or --imds-ca-cert those routes say so', async (t) => {
  const h = await startHarness(t, { configSnapshot: '' });
  const config = await get(h.socket, '/v1/config');
  t.equal(config.status, 404);
  t.match(config.json.error.message, /--config-snapshot/);
  const ca = await get(h.socket, '/v1/ca');
  t.equal(ca.status, 404);
  t.match(ca.json.error.message, /--imds-ca-cert/);
  t.same((await get(h.socket, '/healthz')).json, { status: 'ok' });
});

t.test('GET /v1/credentials lists the rules, never a value', async (t) => {
  const h = await startHarness(t);
  const res = await curl(h.socket, '/v1/credentials');
  t.equal(res.status, 200);
  t.same(JSON.parse(res.body).credentials, [
    { secret: 'gh_token', host: 'api.github.com', port: null, header: 'authorization', format: 'token {}' },
    { secret: 'gh_token', host: '*.github.com', port: null, header: 'authorization', format: 'token {}' },
    { secret: 'gh_token', host: 'uploads.example.com', port: 8443, header: 'x-upload-key', format: '{}' },
    { secret: 'org_token', host: '*.corp.example', port: null, header: 'x-org-key', format: 'Key {}, v=1' },
    { secret: 'db_password', host: 'db.example.com', port: null, header: 'x-db', format: '{}' },
  ]);
  for (const v of [GH_TOKEN, ORG_TOKEN]) t.notOk(res.body.includes(v), 'no value in the list');
});

t.test('GET /v1/credentials/{secret}: the formatted value of the agent (else its org), with its hosts', async (t) => {
  const h = await startHarness(t);
  const gh = await curl(h.socket, '/v1/credentials/gh_token');
  t.equal(gh.status, 200);
  t.same(JSON.parse(gh.body), {
    name: 'gh_token',
    header: 'authorization',
    value: `token ${GH_TOKEN}`,
    hosts: ['api.github.com', '*.github.com'],
    variants: [{ header: 'x-upload-key', value: GH_TOKEN, hosts: ['uploads.example.com:8443'] }],
  });
  t.notOk(gh.body.includes(OTHER_AGENT_TOKEN), "never another agent's secret");

  const org = await get(h.socket, '/v1/credentials/org_token');
  t.equal(org.status, 200);
  t.same(org.json, {
    name: 'org_token',
    header: 'x-org-key',
    value: `Key ${ORG_TOKEN}, v=1`,
    hosts: ['*.corp.example'],
  });
  t.equal(org.headers['cache-control'], 'no-store');

  // A rule whose secret the agent (nor its org) has: 404 naming the secret.
  const missing = await get(h.socket, '/v1/credentials/db_password');
  t.equal(missing.status, 404);
  t.match(missing.json, { type: 'error', error: { type: 'not_found_error', message: /secret "db_password"/ } });

  // The secrets file changes: the next read has the new value.
  await writeFileAtomic(
    h.secretsFile,
    JSON.stringify({ 'agent:agent-1': { gh_token: GH_TOKEN, db_password: 'db-pass-imds-4242' } }),
  );
  t.ok(
    await until(async () => (await get(h.socket, '/v1/credentials/db_password')).status === 200, 10_000),
    'served once the secrets file holds it',
  );

  // Secret names are percent-decoded; a malformed encoding is a 400.
  t.equal((await get(h.socket, '/v1/credentials/gh%5Ftoken')).status, 200);
  t.equal((await get(h.socket, '/v1/credentials/%E0%A4%A')).status, 400);

  // No value in any log line.
  for (const v of [GH_TOKEN, ORG_TOKEN, 'db-pass-imds-4242'])
    t.notOk(h.logs.join('\n').includes(v), 'no value is logged');
  t.ok(
    h.logs.some((l) => l.includes('"secret_name":"gh_token"')),
    'the name is',
  );
});

t.test('prototype names, unknown paths, other methods and bodies are refused, never crash', async (t) => {
  const h = await startHarness(t);
  for (const name of ['__proto__', 'constructor', 'toString', 'hasOwnProperty', '', '..%2F..%2Fetc%2Fpasswd']) {
    const res = await get(h.socket, `/v1/credentials/${name}`);
    t.equal(res.status, 404, `credential ${JSON.stringify(name)}`);
    t.equal(res.json.type, 'error');
  }
  for (const path of [
    '/',
    '/v1',
    '/v1/config/',
    '/v1/configs',
    '/V1/CONFIG',
    '/__proto__',
    '/v1/credentials/gh_token/x',
  ]) {
    t.equal((await get(h.socket, path)).status, 404, path);
  }
  for (const method of ['POST', 'PUT', 'DELETE', 'PATCH', 'HEAD', 'OPTIONS']) {
    const res = await get(h.socket, '/v1/config', { method });
    t.equal(res.status, 405, method);
    t.equal(res.headers.allow, 'GET');
  }
  const withBody = await get(h.socket, '/v1/credentials/gh_token', {
    headers: { 'content-length': '5' },
    body: 'hello',
  });
  t.equal(withBody.status, 400);
  t.equal(withBody.headers.connection, 'close');
  // A query string is ignored; an absolute-form target is not a path.
  t.equal((await get(h.socket, '/v1/config?x=1')).status, 200);
  t.equal((await get(h.socket, 'http://imds/v1/config')).status, 400);

  // Raw bytes: a request that is not HTTP gets a 400 in imds's error shape and a closed connection.
  const raw = await new Promise<string>((resolve, reject) => {
    const c = createConnection({ path: h.socket });
    let text = '';
    c.on('data', (d) => (text += d));
    c.on('close', () => resolve(text));
    c.on('error', reject);
    c.end('GARBAGE\r\n\r\n');
  });
  t.match(raw, /^HTTP\/1\.1 400 /);
  t.match(raw, /"type":"error"/);
  t.same((await get(h.socket, '/healthz')).json, { status: 'ok' }, 'still serving');
});

t.test('--metrics-addr: a TLS Prometheus listener counts the answers by route and status', async (t) => {
  const tls = await tlsDir('dvx-imds-metrics-');
  t.teardown(() => tls.remove());
  const h = await startHarness(t, { metricsAddr: '127.0.0.1:0', tlsCert: tls.cert, tlsKey: tls.key });
  t.ok(h.imds.metricsPort, 'listening');
  await get(h.socket, '/healthz');
  await get(h.socket, '/v1/credentials/gh_token');
  await get(h.socket, '/nowhere');
  const dispatcher = new Agent({ connect: { ca: tls.ca.certPem } });
  t.teardown(() => dispatcher.close());
  const res = await request(`https://127.0.0.1:${h.imds.metricsPort}/metrics`, { dispatcher });
  const text = await res.body.text();
  t.match(text, /dvx_imds_requests_total\{route="healthz",status="200"\} 1/);
  t.match(text, /dvx_imds_requests_total\{route="credential",status="200"\} 1/);
  t.match(text, /dvx_imds_requests_total\{route="other",status="404"\} 1/);
  t.match(text, /dvx_connections_open\{listener="imds"\}/);
});

t.test('GET /v1/ca: the certificates of --imds-ca-cert, as the file holds them now', async (t) => {
  const dir = await tempDir(t);
  const caFile = join(dir, 'ca.pem');
  const [one, two] = [await generateCa(), await generateCa()];
  await writeFile(caFile, `# the gateway's interception CA\n${one.certPem}`);
  const h = await startHarness(t, { imdsCaCert: caFile });
  const first = await curl(h.socket, '/v1/ca');
  t.equal(first.status, 200);
  t.equal(first.body, one.certPem.trim() + '\n', 'the certificate, re-encoded, nothing else');
  t.equal((await get(h.socket, '/v1/ca')).headers['content-type'], 'application/x-pem-file');

  // Rotated: a bundle of two.
  await writeFile(caFile, one.certPem + two.certPem);
  t.equal((await get(h.socket, '/v1/ca')).text, one.certPem.trim() + '\n' + two.certPem.trim() + '\n');

  // A file that now holds a key, or no certificate: the last good bundle, and a log line.
  await writeFile(caFile, two.certPem + two.keyPem);
  const withKey = await get(h.socket, '/v1/ca');
  t.notMatch(withKey.text, /PRIVATE KEY/, 'never a key');
  t.match(withKey.text, /BEGIN CERTIFICATE/);
  await writeFile(caFile, 'garbage');
  t.equal((await get(h.socket, '/v1/ca')).status, 200);
  t.ok(
    h.logs.some((l) => l.includes('imds CA bundle cannot be read again')),
    'logged',
  );
});
