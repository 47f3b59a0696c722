import t from 'tap';
import https from 'node:https';
import type { AddressInfo } from 'node:net';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { getAgent } from '../../../enclave/broker/agents.ts';
import { createLogger } from '../../../core/logger.ts';
import type { AgentIdentity } from '../../../proxy/llm/auth.ts';
import { GatewayOptionsError, OperatorTokenError } from '../../../proxy/egress/errors.ts';
import { openOperatorTokens, parseCpApiHost } from '../../../proxy/egress/operator-tokens.ts';
import { validateGatewayOptions, type GatewayOptions } from '../../../proxy/egress/options.ts';
import { startBrokerHarness } from '../../fixtures/broker-harness.ts';
import { startCpHarness } from '../../fixtures/controlplane-harness.ts';
import { until } from '../../fixtures/eventually.ts';
import { tlsDir } from '../../fixtures/tls-dir.ts';
import { addAgent } from '../../enclave/broker/secrets-fixture.ts';

// Agent-operator tokens for --cp-api-host, minted through a real broker and a real control plane: the
// token comes back and is kept (one mint for a burst, one for concurrent callers), a contained agent is
// refused at the mint (403), a broker that is gone is an OperatorTokenError without a status. A broker
// stand-in (a real node:https server) answers what a broker should not: bodies that are no token, too
// large, too slow. The token is in no log line.

const dir = await mkdtemp(join(tmpdir(), 'dvx-operator-tokens-'));
t.teardown(() => rm(dir, { recursive: true, force: true }));
const logs: string[] = [];
const log = createLogger({ level: 'debug', destination: { write: (s: string) => void logs.push(s) } });
const identity = (agentId: string): AgentIdentity => ({
  agentId,
  orgId: 'org-a',
  agentName: '',
  groupId: null,
  via: 'jwt',
  tokenHeader: 'authorization',
});
const options = (over: Partial<GatewayOptions>) =>
  validateGatewayOptions({
    tlsCert: 'unused.pem',
    tlsKey: 'unused.pem',
    agentJwks: 'unused.json',
    cpApiHost: 'cp.dvx.test',
    ...over,
  });
const failure = async (p: Promise<unknown>): Promise<OperatorTokenError> => {
  const err = await p.then(
    () => null,
    (e: unknown) => e,
  );
  if (!(err instanceof OperatorTokenError)) throw new Error(`expected an OperatorTokenError, got ${String(err)}`);
  return err;
};

t.test('matches --cp-api-host: the host at any port, or host:port at that port', async (t) => {
  t.same(parseCpApiHost('CP.dvx.test'), { host: 'cp.dvx.test', port: null });
  t.same(parseCpApiHost('cp.dvx.test:8443'), { host: 'cp.dvx.test', port: 8443 });
  t.throws(() => parseCpApiHost('cp.dvx.test:70000'), GatewayOptionsError);
});

t.test('through a real broker and control plane', async (t) => {
  const cph = await startCpHarness([{ clientId: 'root', org: 'org-a', human: true }], {
    seedAdmin: ['root'],
    agentTokenIssuerUrl: 'https://cp.dvx.test',
  });
  t.teardown(() => cph.close());
  await cph.call('root', 'POST', '/orgs', { id: 'org-a', name: 'A' });
  const reg = await cph.call('root', 'POST', '/enclaves', { name: 'eu', enclave_id: 'enc-test', owning_org: 'org-a' });
  t.equal(reg.status, 201);
  await writeFile(join(dir, 'cp-ca.pem'), cph.ca);
  const h = await startBrokerHarness({
    controlplane: `https://127.0.0.1:${cph.cp.port}`,
    brokerKey: reg.body.key.token as string,
    enclaveId: 'enc-test',
    caCert: join(dir, 'cp-ca.pem'),
  });
  t.teardown(() => h.close());
  await writeFile(join(dir, 'broker-ca.pem'), h.tls.ca.certPem);
  const tokens = await openOperatorTokens(
    options({
      cpApiHost: 'cp.dvx.test:8443',
      secretBrokerUrl: `https://127.0.0.1:${h.broker.agentPort}`,
      secretBrokerTokenFile: join(h.dir, 'state', 'satellite-token'),
      brokerCa: join(dir, 'broker-ca.pem'),
    }),
    log,
  );
  t.teardown(() => tokens.close());
  t.ok(tokens.matches('cp.dvx.test', 8443));
  t.ok(tokens.matches('CP.DVX.TEST.', 8443), 'as rules compare hosts');
  t.notOk(tokens.matches('cp.dvx.test', 443), 'another port');
  t.notOk(tokens.matches('api.dvx.test', 8443));

  for (const uid of ['bot-1', 'bot-2'])
    t.equal(
      (await cph.call('root', 'POST', '/orgs/org-a/agents', { uid, name: uid, enclave_id: 'enc-test' })).status,
      201,
    );
  t.ok(await until(async () => (await getAgent(h.broker.deps.db, 'bot-2')) !== null), 'the broker runs the agents');
  const mints = () => cph.audit.filter((r) => r.action === 'agent-operator-token.mint').length;

  const before = mints();
  const token = await tokens.token(identity('bot-1'));
  t.match(token, /^ey[\w-]+\.[\w-]+\.[\w-]+$/, 'a JWT');
  t.equal(mints(), before + 1, 'minted by the control plane');
  t.match(cph.audit.at(-1), {
    action: 'agent-operator-token.mint',
    resource: 'agent:bot-1',
    actor: 'enclave:enc-test',
  });
  t.equal(await tokens.token(identity('bot-1')), token, 'kept');
  t.equal(mints(), before + 1, 'not minted again');

  const together = await Promise.all(Array.from({ length: 8 }, () => tokens.token(identity('bot-2'))));
  t.equal(new Set(together).size, 1, 'concurrent callers share one token');
  t.not(together[0], token, 'each agent has its own');
  t.equal(mints(), before + 2, 'one mint for eight concurrent callers');

  // Contained on the control plane: once the broker has it, the mint is refused there (403).
  t.equal(
    (await cph.call('root', 'POST', '/orgs/org-a/agents', { uid: 'bot-3', name: 'bot-3', enclave_id: 'enc-test' }))
      .status,
    201,
  );
  t.equal((await cph.call('root', 'POST', '/orgs/org-a/agents/bot-3/containment', { contained: true })).status, 200);
  t.ok(await until(async () => (await getAgent(h.broker.deps.db, 'bot-3'))?.contained === true), 'contained');
  const contained = await failure(tokens.token(identity('bot-3')));
  t.equal(contained.status, 403, 'a contained agent is refused at the mint');
  t.match(contained.message, /refused for agent bot-3: .*contained/);
  await addAgent(h, 'bot-4', 'org-a', null, 'suspended');
  t.equal((await failure(tokens.token(identity('bot-4')))).status, 403, 'a suspended one too');
  t.equal((await failure(tokens.token(identity('nobody')))).status, 404, 'an agent this enclave does not run');

  // The broker gone: no status.
  const kept = await tokens.token(identity('bot-1'));
  t.equal(kept, token, 'a kept token needs no broker');
  await h.broker.close();
  const down = await failure(tokens.token(identity('bot-9')));
  t.equal(down.status, null, 'the broker did not answer');
  t.match(down.message, /did not answer/);
  await h.restart(); // for the harness's teardown

  const text = logs.join('\n');
  for (const secret of [token, together[0]!, (await readFile(join(h.dir, 'state', 'satellite-token'), 'utf8')).trim()])
    t.notOk(text.includes(secret), 'no token in any log line');
  t.ok(
    logs.some((l) => l.includes('agent-operator token minted')),
    'the log says a token was minted',
  );
});

t.test('what a broker should not answer: refused, never passed on as a token', async (t) => {
  const tlsFiles = await tlsDir('dvx-op-broker-');
  t.teardown(() => tlsFiles.remove());
  const seen: { auth: string | undefined; path: string }[] = [];
  const answers: Record<string, (res: import('node:http').ServerResponse) => void> = {
    short: (res) => json(res, 200, { access_token: 'tok-short', token_type: 'Bearer', expires_in: 10 }),
    long: (res) => json(res, 200, { access_token: 'tok-long', token_type: 'bearer', expires_in: 60 }),
    huge: (res) => json(res, 200, { access_token: 'x'.repeat(100_000), token_type: 'Bearer', expires_in: 60 }),
    text: (res) => res.writeHead(200, { 'content-type': 'text/plain' }).end('here you are'),
    crlf: (res) => json(res, 200, { access_token: 'tok\r\nx-evil: 1', token_type: 'Bearer', expires_in: 60 }),
    mac: (res) => json(res, 200, { access_token: 'tok', token_type: 'MAC', expires_in: 60 }),
    forever: (res) => json(res, 200, { access_token: 'tok', token_type: 'Bearer', expires_in: -1 }),
    proto: (res) =>
      res.writeHead(200).end('{"__proto__": {"access_token": "tok", "token_type": "Bearer", "expires_in": 60}}'),
    down: (res) => json(res, 503, { detail: 'the control plane did not answer' }),
    hang: () => {},
  };
  const server = https.createServer(
    { cert: await readFile(tlsFiles.cert), key: await readFile(tlsFiles.key) },
    (req, res) => {
      const uid = /^\/v1\/satellite\/agents\/([^/]+)\/operator-token$/.exec(req.url ?? '')?.[1] ?? '';
      seen.push({ auth: req.headers.authorization, path: req.url ?? '' });
      req.resume();
      (answers[uid] ?? ((r) => json(r, 404, {})))(res);
    },
  );
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.teardown(() => {
    server.closeAllConnections();
    server.close();
  });
  await writeFile(join(dir, 'stand-in-ca.pem'), tlsFiles.ca.certPem);
  await writeFile(join(dir, 'satellite-token'), 'dvxs_stand-in-token\n');
  const tokens = await openOperatorTokens(
    options({
      secretBrokerUrl: `https://127.0.0.1:${(server.address() as AddressInfo).port}`,
      secretBrokerTokenFile: join(dir, 'satellite-token'),
      brokerCa: join(dir, 'stand-in-ca.pem'),
      upstreamTimeout: 500,
    }),
    log,
  );
  t.teardown(() => tokens.close());

  t.equal(await tokens.token(identity('long')), 'tok-long');
  t.same(seen.at(-1), { auth: 'Bearer dvxs_stand-in-token', path: '/v1/satellite/agents/long/operator-token' });
  await tokens.token(identity('long'));
  t.equal(seen.length, 1, 'kept until 10 s before it expires');
  t.equal(await tokens.token(identity('short')), 'tok-short');
  t.equal(await tokens.token(identity('short')), 'tok-short');
  t.equal(seen.length, 3, 'a token with 10 s or less to live is never kept');
  for (const uid of ['huge', 'text', 'crlf', 'mac', 'forever', 'proto', 'hang']) {
    const err = await failure(tokens.token(identity(uid)));
    t.equal(err.status, null, `${uid}: no usable answer`);
  }
  const unavailable = await failure(tokens.token(identity('down')));
  t.equal(unavailable.status, 503);
  t.match(unavailable.message, /answered 503.*control plane did not answer/);
  t.notOk(logs.join('\n').includes('dvxs_stand-in-token'), 'the satellite token is in no log line');

  await tokens.close();
  t.equal((await failure(tokens.token(identity('long')))).status, null, 'closed: nothing more is minted');
});

t.test('the start is refused without a readable satellite token or broker CA', async (t) => {
  const base = { secretBrokerUrl: 'https://127.0.0.1:1', secretBrokerTokenFile: join(dir, 'none') };
  await t.rejects(openOperatorTokens(options(base), log), {
    name: GatewayOptionsError.name,
    message: /cannot read --secret-broker-token-file/,
  });
  await writeFile(join(dir, 'empty-token'), '\n');
  await t.rejects(openOperatorTokens(options({ ...base, secretBrokerTokenFile: join(dir, 'empty-token') }), log), {
    name: GatewayOptionsError.name,
    message: /is empty/,
  });
  await writeFile(join(dir, 'token'), 'dvxs_x');
  await t.rejects(
    openOperatorTokens(
      options({ ...base, secretBrokerTokenFile: join(dir, 'token'), brokerCa: join(dir, 'no-ca.pem') }),
      log,
    ),
    { name: GatewayOptionsError.name, message: /cannot read --broker-ca/ },
  );
});

function json(res: import('node:http').ServerResponse, status: number, body: unknown): void {
  res.writeHead(status, { 'content-type': 'application/json' }).end(JSON.stringify(body));
}
