import t from 'tap';
import { request } from 'undici';
import { until } from '../../fixtures/eventually.ts';
import {
  anthropicBody,
  baseSnapshot,
  PLATFORM_KEY,
  startHarness,
  type Harness,
} from '../../fixtures/llmproxy-harness.ts';

// A reload reaches llmproxy's open calls (docs/decisions.md, "A reload reaches llmproxy's open calls"):
// a call whose agent the new snapshot contains, suspends, isolates, moves to another org or removes is
// cut — a stream before its final event, a call not answered yet with the spec's 403 — and its record
// says `deny` with `policy changed: <why>`; the calls of other agents go on. Real TLS, the official
// SDK, a node:http upstream whose streams stall open (x-test-behavior: stall) or never answer (hang).

/** The harness's snapshot with a second active agent of org-1, `agent-2`, changed by `change`. */
const snapshotWith = (url: string, change: (agents: Record<string, Record<string, unknown>>) => void = () => {}) => {
  const snapshot = baseSnapshot(url) as { agents: Record<string, Record<string, unknown>> };
  snapshot.agents['agent-2'] = { ...snapshot.agents['agent-1'], name: 'two' };
  change(snapshot.agents);
  return snapshot;
};

const recordOf = (h: Harness, sub: string) =>
  h.audit.filter((r) => r.agent_id === sub && r.table === 'llm_audit_log').at(-1);

/** The calls cut so far, by the proxy's log lines. */
const cuts = (h: Harness) => h.logs.filter((l) => l.msg === 'open call cut: the policy snapshot now refuses its agent');

async function start(t: { teardown(fn: () => unknown): void }): Promise<Harness> {
  const h = await startHarness({
    snapshot: (url) => snapshotWith(url),
    secrets: {
      'agent:agent-1': { 'agent:llmproxy.llm.api_key': PLATFORM_KEY },
      'agent:agent-2': { 'agent:llmproxy.llm.api_key': PLATFORM_KEY },
    },
  });
  t.teardown(() => h.close());
  return h;
}

/** An SDK stream that has received its first event and then waits (the upstream stalls). */
async function openStream(h: Harness, sub: string) {
  const client = h.anthropic(await h.token({ sub }));
  const stream = await client.messages.create(
    { model: 'claude-sonnet-4-5', max_tokens: 8, messages: [{ role: 'user', content: 'hi' }], stream: true },
    { headers: { 'x-test-behavior': 'stall' } },
  );
  const events: string[] = [];
  const it = stream[Symbol.asyncIterator]();
  const abort = () => stream.controller.abort();
  const first = await it.next();
  if (!first.done) events.push(first.value.type);
  const rest = (async () => {
    try {
      for (let n = await it.next(); !n.done; n = await it.next()) events.push(n.value.type);
      return { ended: 'complete' as const, events };
    } catch (err) {
      return { ended: 'error' as const, events, message: (err as Error).message };
    }
  })();
  return { events, rest, abort };
}

t.test('a contained agent: its open stream is cut before its final event, another agent streams on', async (t) => {
  const h = await start(t);
  const mine = await openStream(h, 'agent-1');
  const theirs = await openStream(h, 'agent-2');
  t.same(mine.events, ['message_start'], 'the stream is open');
  await h.writeSnapshot(
    snapshotWith(h.upstream.url, (agents) => {
      agents['agent-1'].contained = true;
    }),
  );
  const ended = await Promise.race([mine.rest, new Promise((r) => setTimeout(() => r('still open'), 5000))]);
  t.match(ended, { ended: 'error' }, 'the SDK sees the stream end short of its final event');
  t.notOk(mine.events.includes('message_stop'), 'no message_stop reached the agent');
  t.ok(await until(() => recordOf(h, 'agent-1') !== undefined), 'the call has its record');
  t.match(recordOf(h, 'agent-1'), { decision: 'deny', error: 'policy changed: agent is contained', status: 200 });
  t.ok(
    await until(() => h.upstream.received.filter((r) => r.outcome === 'cut').length === 1),
    'the upstream call was released',
  );
  t.match(cuts(h), [{ agent_id: 'agent-1', reason: 'policy changed: agent is contained' }], 'the cut is logged, once');
  // agent-2's stream was not touched by the reload.
  t.equal(recordOf(h, 'agent-2'), undefined, 'the other agent has no record yet: its call is open');
  t.equal(h.upstream.received.filter((r) => r.outcome === 'answering').length, 1, "the other agent's call is open");
  // A new call of the contained agent is refused as before.
  const again = await h.call('/v1/messages', {
    headers: { 'content-type': 'application/json', 'x-api-key': await h.token({ sub: 'agent-1' }) },
    body: anthropicBody('hello'),
  });
  t.equal(again.status, 403);
  // Suspending agent-2 too ends its stream.
  await h.writeSnapshot(
    snapshotWith(h.upstream.url, (agents) => {
      agents['agent-1'].contained = true;
      agents['agent-2'].status = 'suspended';
    }),
  );
  t.match(await theirs.rest, { ended: 'error' });
  t.ok(await until(() => recordOf(h, 'agent-2') !== undefined));
  t.match(recordOf(h, 'agent-2'), { decision: 'deny', error: 'policy changed: agent is suspended' });
});

t.test(
  'a call not answered yet is answered 403 when its agent is removed, and its upstream call aborted',
  async (t) => {
    const h = await start(t);
    const pending = request(`${h.url}/v1/messages`, {
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        'x-api-key': await h.token({ sub: 'agent-2' }),
        'x-test-behavior': 'hang',
      },
      body: anthropicBody('hello'),
      dispatcher: h.dispatcher,
    });
    t.ok(await until(() => h.upstream.received.length === 1), 'the call reached the upstream, which holds it');
    await h.writeSnapshot(
      snapshotWith(h.upstream.url, (agents) => {
        delete agents['agent-2'];
      }),
    );
    const res = await pending;
    t.equal(res.statusCode, 403, 'the spec 403');
    t.match(JSON.parse(await res.body.text()), { type: 'error', error: { type: 'permission_error' } });
    t.ok(await until(() => recordOf(h, 'agent-2') !== undefined));
    t.match(recordOf(h, 'agent-2'), {
      decision: 'deny',
      error: 'policy changed: agent was removed from the policy snapshot',
      status: 403,
    });
    t.ok(await until(() => h.upstream.received[0].outcome === 'cut'), 'the upstream call was aborted');
    // The removed agent's credential still verifies, but it is refused from now on.
    const again = await h.call('/v1/messages', {
      headers: { 'content-type': 'application/json', 'x-api-key': await h.token({ sub: 'agent-2' }) },
      body: anthropicBody('hello'),
    });
    t.equal(again.status, 403, 'a new call of the removed agent');
    // An agent no snapshot ever listed is still served as its credential says (here: no credential).
    const unlisted = await h.call('/v1/messages', {
      headers: { 'content-type': 'application/json', 'x-api-key': await h.token({ sub: 'agent-new' }) },
      body: anthropicBody('hello'),
    });
    t.equal(unlisted.status, 500, 'a never-listed agent is past admission');
  },
);

t.test('a reload that changes nothing for the agent leaves its stream alone', async (t) => {
  const h = await start(t);
  const mine = await openStream(h, 'agent-1');
  await h.writeSnapshot(
    snapshotWith(h.upstream.url, (agents) => {
      agents['agent-1'].name = 'renamed';
    }),
  );
  const ended = await Promise.race([mine.rest, new Promise((r) => setTimeout(() => r('still open'), 500))]);
  t.equal(ended, 'still open', 'the stream is still open after the reload');
  t.equal(cuts(h).length, 0, 'nothing cut');
  mine.abort();
  await mine.rest;
});

t.test(
  'a cut that lands while the answer waits for its durable record delivers nothing (capture-or-deny)',
  async (t) => {
    // An audit sink whose llm_audit_log append waits, like a slow fdatasync, until the test releases it.
    const records: Record<string, unknown>[] = [];
    let release: (() => void) | null = null;
    let waiting = false;
    const sink = {
      async append(table: string, record: Record<string, unknown>) {
        records.push({ table, ...record });
        if (table === 'llm_audit_log' && release === null) {
          waiting = true;
          await new Promise<void>((resolve) => (release = resolve));
        }
      },
      async flush() {},
      async close() {},
    };
    const h = await startHarness({ audit: sink as never, durableAudit: true, proxy: { auditCaptureOrDeny: true } });
    t.teardown(() => h.close());
    const pending = request(`${h.url}/v1/messages`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-api-key': await h.token({ sub: 'agent-1' }) },
      body: anthropicBody('hello'),
      dispatcher: h.dispatcher,
    });
    t.ok(await until(() => waiting), 'the answer waits for its record');
    const contained = baseSnapshot(h.upstream.url) as { agents: Record<string, Record<string, unknown>> };
    contained.agents['agent-1'].contained = true;
    await h.writeSnapshot(contained);
    t.equal(cuts(h).length, 1, 'the call was cut');
    release!();
    const res = await pending;
    t.equal(res.statusCode, 403, 'the contained agent gets the spec 403, not the answer');
    t.match(JSON.parse(await res.body.text()), { type: 'error', error: { type: 'permission_error' } });
    const calls = records.filter((r) => r.table === 'llm_audit_log');
    t.match(calls, [
      { decision: 'allow', status: 200 },
      { decision: 'deny', status: 403, error: 'policy changed: agent is contained' },
    ]);
    t.equal(calls[1].id, `${calls[0].id}.cut`, 'the cut is a record of its own, under a derived id');
  },
);
