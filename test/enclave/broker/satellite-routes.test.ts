import t from 'tap';
import { createServer } from 'node:net';
import { mkdtemp, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { request } from 'undici';
import { SseParser, type SseEvent } from '../../../core/sse.ts';
import { satelliteToken } from '../../../enclave/broker/satellite-routes.ts';
import { createLogger } from '../../../core/logger.ts';
import { startBrokerHarness, type BrokerHarness } from '../../fixtures/broker-harness.ts';
import { until } from '../../fixtures/eventually.ts';
import { tokenIssuer } from '../../fixtures/agent-identity.ts';
import { startCpHarness } from '../../fixtures/controlplane-harness.ts';
import { addAgent } from './secrets-fixture.ts';

// The satellites' routes on the agent listener: the satellite token (created 0600 on first start,
// kept across restarts, compared by hash), the merged secrets every satellite is served, the event
// stream that says when they changed, and the agent-operator token refused for a contained agent before
// the control plane is asked.

const PERSONAS = [{ clientId: 'admin-a', org: 'org-a', human: true }];

/** An open satellite events stream: its events as they arrive, and whether a heartbeat came. */
async function events(h: BrokerHarness, token: string) {
  const abort = new AbortController();
  const res = await request(`https://127.0.0.1:${h.broker.agentPort}/v1/satellite/events`, {
    dispatcher: h.dispatcher,
    headers: { authorization: `Bearer ${token}` },
    signal: abort.signal,
  });
  const seen: SseEvent[] = [];
  let raw = '';
  let ended = false;
  const parser = new SseParser();
  const reading = (async () => {
    try {
      for await (const chunk of res.body) {
        raw += (chunk as Buffer).toString();
        seen.push(...parser.push(chunk as Buffer));
      }
    } catch {
      // aborted by the test
    }
    ended = true;
  })();
  return {
    status: res.statusCode,
    headers: res.headers,
    seen,
    raw: () => raw,
    ended: () => ended,
    versions: () => seen.filter((e) => e.event === 'secrets').map((e) => JSON.parse(e.data).version as number),
    async close() {
      abort.abort();
      await reading;
    },
  };
}

t.test('the satellite token: created 0600 once, kept, and the only way in', async (t) => {
  const h = await startBrokerHarness({ seedAdmin: ['admin-a'], heartbeatMs: 100 }, PERSONAS);
  t.teardown(() => h.close());
  const file = join(h.dir, 'state', 'satellite-token');
  t.equal((await stat(file)).mode & 0o777, 0o600, 'the token file is 0600');
  const token = (await readFile(file, 'utf8')).trim();
  t.match(token, /^dvxs_[A-Za-z0-9_-]{43}$/);

  const jwt = await (await tokenIssuer()).mint({ sub: 'agent-1', org_id: 'org-a' });
  for (const [what, bearer] of [
    ['no token', null],
    ['a wrong token', 'dvxs_wrong'],
    ['the token with a byte more', `${token}x`],
    ["an agent's JWT", jwt],
  ] as const) {
    for (const path of ['/v1/satellite/secrets', '/v1/satellite/events']) {
      const res = await h.agent('GET', path, undefined, bearer);
      t.equal(res.status, 401, `${what}: ${path}`);
      t.match(res.type, /^application\/problem\+json/);
      t.equal(res.headers['www-authenticate'], 'Bearer');
    }
    t.equal((await h.agent('POST', '/v1/satellite/agents/agent-1/operator-token', undefined, bearer)).status, 401);
  }
  t.equal((await h.agent('GET', '/v1/satellite/secrets', undefined, token)).status, 200);

  // Restarted, the broker keeps its token.
  await h.broker.close();
  await h.restart();
  t.equal((await readFile(file, 'utf8')).trim(), token, 'the same token after a restart');
  t.equal((await h.agent('GET', '/v1/satellite/secrets', undefined, token)).status, 200);

  // A token file an operator wrote is used as it is; an empty one refuses the start.
  const log = createLogger({ level: 'error', destination: { write: () => {} } });
  await writeFile(join(h.dir, 'mine'), 'dvxs_operator-chosen\n', { mode: 0o600 });
  t.equal(await satelliteToken(join(h.dir, 'mine'), log), 'dvxs_operator-chosen');
  await writeFile(join(h.dir, 'empty'), '\n');
  await t.rejects(satelliteToken(join(h.dir, 'empty'), log), /is empty/);
  await t.rejects(satelliteToken(join(h.dir, 'nodir', 'x'), log), /cannot create the satellite token file/);
  // Two brokers creating one file together agree on one token.
  const both = await Promise.all([
    satelliteToken(join(h.dir, 'raced'), log),
    satelliteToken(join(h.dir, 'raced'), log),
  ]);
  t.equal(both[0], both[1]);
});

t.test('GET /v1/satellite/secrets and the events stream', async (t) => {
  const h = await startBrokerHarness({ seedAdmin: ['admin-a'], heartbeatMs: 100 }, PERSONAS);
  t.teardown(() => h.close());
  const token = (await readFile(join(h.dir, 'state', 'satellite-token'), 'utf8')).trim();
  await addAgent(h, 'agent-1', 'org-a', 'g-1');
  await addAgent(h, 'agent-2', 'org-a', null);
  await addAgent(h, 'agent-c', 'org-c', null, 'suspended', true);
  const put = (name: string, value: string, q = '') =>
    h.operator('admin-a', 'PUT', `/api/v1/secrets/${encodeURIComponent(name)}${q}`, { value });

  const empty = await h.agent('GET', '/v1/satellite/secrets', undefined, token);
  t.same(empty.body, { version: 0, agents: { 'agent-1': {}, 'agent-2': {}, 'agent-c': {} }, orgs: {} });
  t.equal(empty.headers['cache-control'], 'no-store');

  const stream = await events(h, token);
  t.teardown(() => stream.close());
  t.equal(stream.status, 200);
  t.match(stream.headers['content-type'], /^text\/event-stream/);
  t.ok(await until(() => stream.versions().length === 1), 'the current version at once');
  t.same(stream.versions(), [0]);
  t.ok(await until(() => stream.raw().includes(': heartbeat')), 'heartbeats');

  t.equal((await put('llmproxy:llm.api_key', 'sk-org-a-key-0123')).status, 200);
  t.ok(await until(() => stream.versions().at(-1) === 1), 'an event for the write');
  await put('db_password', 'group-pw-12345', '?group=g-1');
  await put('agent:llmproxy.llm.api_key', 'sk-agent-1-key-0123', '?agent=agent-1');
  t.ok(await until(() => stream.versions().at(-1) === 3), 'an event for each write');
  // Names that are Object.prototype members are names like any other.
  await put('__proto__', 'proto-value-123', '?agent=agent-2');
  await put('constructor', 'ctor-value-123', '?agent=agent-2');
  t.ok(await until(() => stream.versions().at(-1) === 5));
  t.same(stream.versions(), [...new Set(stream.versions())].sort(), 'versions only go up, none twice');

  const all = await h.agent('GET', '/v1/satellite/secrets', undefined, token);
  t.same(all.body, {
    version: 5,
    agents: {
      'agent-1': {
        'llmproxy:llm.api_key': 'sk-org-a-key-0123',
        db_password: 'group-pw-12345',
        'agent:llmproxy.llm.api_key': 'sk-agent-1-key-0123',
      },
      'agent-2': {
        'llmproxy:llm.api_key': 'sk-org-a-key-0123',
        ['__proto__']: 'proto-value-123',
        constructor: 'ctor-value-123',
      },
      'agent-c': {},
    },
    orgs: { 'org-a': { 'llmproxy:llm.api_key': 'sk-org-a-key-0123' } },
  });
  t.ok(Object.hasOwn(all.body.agents['agent-2'], '__proto__'), '__proto__ is an own entry');
  for (const v of ['sk-org-a-key-0123', 'group-pw-12345', 'sk-agent-1-key-0123'])
    t.notOk(h.logs.join('\n').includes(v), 'no value in a log line');

  // A second satellite that opens the stream and never reads it: writes go on for the first, and the
  // broker still shuts down with both streams open (each ends with `event: end`, or is cut).
  const idle = await request(`https://127.0.0.1:${h.broker.agentPort}/v1/satellite/events`, {
    dispatcher: h.dispatcher,
    headers: { authorization: `Bearer ${token}` },
  });
  t.equal(idle.statusCode, 200);
  for (let i = 0; i < 5; i++) await put('churn', `churn-value-${i}`);
  t.ok(await until(() => stream.versions().at(-1) === 10));
  await h.broker.close();
  t.ok(await until(() => stream.ended()), 'the stream ends when the broker stops');
  t.match(stream.raw(), /event: end\ndata: \{"reason":"shutdown"\}/);
  await idle.body.dump().catch(() => {});
  await h.restart();
});

t.test("the agent-operator token on an agent's behalf", async (t) => {
  // A control plane that is not there: a port nothing listens on.
  const port = await new Promise<number>((resolve) => {
    const s = createServer().listen(0, '127.0.0.1', () => {
      const p = (s.address() as { port: number }).port;
      s.close(() => resolve(p));
    });
  });
  const h = await startBrokerHarness({ seedAdmin: ['admin-a'] }, PERSONAS);
  t.teardown(() => h.close());
  const token = (await readFile(join(h.dir, 'state', 'satellite-token'), 'utf8')).trim();
  await addAgent(h, 'agent-1', 'org-a', 'g-1');
  await addAgent(h, 'agent-contained', 'org-a', 'g-1', 'active', true);
  await addAgent(h, 'agent-suspended', 'org-a', 'g-1', 'suspended');
  const mint = (uid: string) => h.agent('POST', `/v1/satellite/agents/${uid}/operator-token`, undefined, token);

  t.equal((await mint('nobody')).status, 404, 'an agent this enclave does not run');
  const contained = await mint('agent-contained');
  t.equal(contained.status, 403);
  t.match(contained.body.detail, /contained/);
  t.equal((await mint('agent-suspended')).status, 403, 'a suspended agent likewise');
  t.match(
    h.audit.find((r) => r.action === 'agent-operator-token.mint'),
    {
      outcome: 'deny',
      resource: 'agent:agent-contained',
      org_id: 'org-a',
      actor: 'satellite',
      reason: 'agent agent-contained is contained',
    },
    'the refusal is audited',
  );
  const none = await mint('agent-1');
  t.equal(none.status, 503, 'no --controlplane');
  t.match(none.body, { type: 'https://dvx.dev/problems/no-controlplane', detail: /--controlplane/ });

  await h.broker.close();
  await h.restart({
    controlplane: `https://127.0.0.1:${port}`,
    brokerKey: 'dvx-broker-key-secret-0123',
    enclaveId: 'enc-test',
  });
  const down = await mint('agent-1');
  t.equal(down.status, 502, 'the control plane unreachable');
  t.match(down.body, { type: 'https://dvx.dev/problems/controlplane-unavailable' });
  t.equal((await mint('agent-contained')).status, 403, 'contained: refused before the control plane is asked');
  t.notOk(h.logs.join('\n').includes('dvx-broker-key-secret-0123'), 'the broker key is in no log line');
});

t.test('the agent-operator token comes from a real control plane, through the broker', async (t) => {
  const cph = await startCpHarness([{ clientId: 'root', org: 'org-a', human: true }], {
    seedAdmin: ['root'],
    agentTokenIssuerUrl: 'https://cp.dvx.test',
  });
  t.teardown(() => cph.close());
  await cph.call('root', 'POST', '/orgs', { id: 'org-a', name: 'A' });
  const reg = await cph.call('root', 'POST', '/enclaves', { name: 'eu', enclave_id: 'enc-test', owning_org: 'org-a' });
  t.equal(reg.status, 201);
  t.equal(
    (await cph.call('root', 'POST', '/orgs/org-a/agents', { uid: 'bot-1', name: 'one', enclave_id: 'enc-test' }))
      .status,
    201,
  );
  const dir = await mkdtemp(join(tmpdir(), 'dvx-cp-ca-'));
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  await writeFile(join(dir, 'ca.pem'), cph.ca);

  const h = await startBrokerHarness({
    controlplane: `https://127.0.0.1:${cph.cp.port}`,
    brokerKey: reg.body.key.token,
    enclaveId: 'enc-test',
    caCert: join(dir, 'ca.pem'),
  });
  t.teardown(() => h.close());
  const token = (await readFile(join(h.dir, 'state', 'satellite-token'), 'utf8')).trim();
  await addAgent(h, 'bot-1', 'org-a', null);
  await addAgent(h, 'bot-unknown-upstream', 'org-a', null);
  const mint = (uid: string) => h.agent('POST', `/v1/satellite/agents/${uid}/operator-token`, undefined, token);

  const ok = await mint('bot-1');
  t.equal(ok.status, 200);
  t.match(ok.body, { token_type: 'Bearer', expires_in: 60, access_token: /^ey/ });
  t.equal(ok.headers['cache-control'], 'no-store');
  t.match(cph.audit.at(-1), {
    action: 'agent-operator-token.mint',
    actor: 'enclave:enc-test',
    resource: 'agent:bot-1',
  });
  // The control plane's own refusal is relayed as it answered.
  const unknown = await mint('bot-unknown-upstream');
  t.equal(unknown.status, 404);
  t.match(unknown.body, { type: 'https://dvx.dev/problems/not-found' });

  // Contained on the broker's side: refused there; the control plane is not asked (no new mint record).
  const records = cph.audit.length;
  await addAgent(h, 'bot-1', 'org-a', null, 'active', true);
  t.equal((await mint('bot-1')).status, 403);
  t.equal(cph.audit.length, records, 'the control plane was not asked');

  // A broker key the control plane does not know: a 502, not the control plane's 401 (the satellite's
  // token is fine).
  await addAgent(h, 'bot-1', 'org-a', null);
  await h.broker.close();
  await h.restart({ brokerKey: 'dvxb_not-the-key' });
  const refused = await mint('bot-1');
  t.equal(refused.status, 502);
  t.match(refused.body.detail, /answered 401/);
  t.notOk(h.logs.join('\n').includes(reg.body.key.token), 'the broker key is in no log line');
});
