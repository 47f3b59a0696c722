import t from 'tap';
import https from 'node:https';
import type { AddressInfo } from 'node:net';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { issueCertificate } from '../../../core/tls.ts';
import { startLlmProxy } from '../../../proxy/llm/server.ts';
import { validateOptions } from '../../../proxy/llm/options.ts';
import { parseSatelliteSecrets } from '../../../proxy/llm/secret-broker.ts';
import { anthropicBody, post, startHarness } from '../../fixtures/llmproxy-harness.ts';
import { runDvx } from '../../fixtures/run-dvx.ts';
import { tlsDir } from '../../fixtures/tls-dir.ts';

// llmproxy's secret-broker options: one secret source, an https broker and its token, checked before
// anything starts; --broker-ca trusted for an https --agent-jwks; the broker's document checked whole.

t.test('an https --agent-jwks is fetched trusting --broker-ca', async (t) => {
  // A host serving the JWKS under a private CA, as the broker does.
  const tls = await tlsDir('dvx-jwks-host-');
  t.teardown(() => tls.remove());
  const caFile = join(tls.dir, 'ca.pem');
  await writeFile(caFile, tls.ca.certPem);
  const leaf = await issueCertificate(tls.ca, { commonName: 'localhost', ipAddresses: ['127.0.0.1'] });
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
  t.throws(
    () => validateOptions({ ...base, secretBrokerTokenFile: 't' }),
    /--secret-broker-token-file is the token of --secret-broker-url and --approvals-url, neither of which is set/,
  );
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
