import t from 'tap';
import { readFile, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { request } from 'undici';
import { SseParser, type SseEvent } from '../../../core/sse.ts';
import { satelliteToken } from '../../../enclave/broker/satellite-routes.ts';
import { createLogger } from '../../../core/logger.ts';
import { startBrokerHarness, type BrokerHarness } from '../../fixtures/broker-harness.ts';
import { until } from '../../fixtures/eventually.ts';
import { tokenIssuer } from '../../fixtures/agent-identity.ts';
import { addAgent } from './secrets-fixture.ts';

// The satellites' routes on the agent listener: the satellite token (created 0600 on first start,
// kept across restarts, compared by hash), the merged secrets every satellite is served and the event
// stream that says when they changed. The agent-operator token: satellite-operator-token.test.ts.

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

// One broker for the file (each start of a PGlite store takes seconds).
const h = await startBrokerHarness({ seedAdmin: ['admin-a'], heartbeatMs: 100 }, PERSONAS);
t.teardown(() => h.close());

t.test('the satellite token: created 0600 once, kept, and the only way in', async (t) => {
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
});
