import t from 'tap';
import { until } from '../../fixtures/eventually.ts';
import { matrix } from './tool-approvals-matrix.ts';
import {
  decide,
  decisionsOf,
  FORMATS,
  pendingOf,
  raw,
  startE2eBroker,
  startE2eProxy,
  upstreamBytes,
  WIRE,
  type Format,
} from './tool-approvals-fixture.ts';

// The tool-call approval loop end to end, streamed answers (tool-approvals-matrix.ts), through the
// tool gate: llmproxy with its snapshot's tool policy and the production decider, a real broker, a
// person deciding on the broker's operator API, the official SDKs' streaming helpers. Beyond the
// matrix: the text before a held call reaches the agent before anyone decided, and a call held longer
// than the gate's keep-alive period (15 s, not an option of the proxy) gets the format's keep-alive
// while the stream stays open, then the upstream's bytes once approved.

const b = await startE2eBroker();
t.teardown(() => b.close());
const h = await startE2eProxy(b);
t.teardown(() => h.close());

const CALL: Record<Format, string> = {
  'anthropic-messages': '"type":"tool_use"',
  'openai-chat': '"tool_calls"',
  'openai-responses': '"type":"function_call"',
};
const END: Record<Format, string> = {
  'anthropic-messages': 'event: message_stop',
  'openai-chat': 'data: [DONE]',
  'openai-responses': 'event: response.completed',
};
const KEEP_ALIVE: Record<Format, string> = {
  'anthropic-messages': 'event: ping\ndata: {"type": "ping"}\n\n',
  'openai-chat': ': keep-alive\n\n',
  'openai-responses': ': keep-alive\n\n',
};

/** A raw stream through the proxy, read into `text` in the background. */
async function reading(format: Format, agent: string, tool: string, reply: string) {
  const { res, headers, body } = await raw(h, format, true, agent, [{ name: tool, input: { n: 1 } }], reply);
  const got = { text: '', done: false, headers, body, status: res.statusCode };
  const done = (async () => {
    for await (const chunk of res.body) got.text += chunk.toString();
    got.done = true;
  })();
  return Object.assign(got, { ended: done });
}

// Held from the start of the file to its end (past the 15 s keep-alive period), one per format.
const started = Date.now();
const longHeld = await Promise.all(
  FORMATS.map((f) => reading(f, 'agent-6', `hold_${f.replace('-', '_')}_long`, 'Waiting for a person.')),
);

matrix(t, h, b, true, 'agent-2');

for (const format of FORMATS) {
  t.test(`${format} streamed: the text before a held call reaches the agent before the decision`, async (t) => {
    const tool = `hold_${format.replace('-', '_')}_text`;
    const got = await reading(format, 'agent-3', tool, 'Wiring the money.');
    t.equal(got.status, 200);
    t.ok(await until(() => got.text.includes('money.')), 'the text arrived');
    const pending = await pendingOf(b, tool);
    t.notOk(got.text.includes(CALL[format]), 'the call itself is held');
    t.notOk(got.done, 'the stream is open');
    await decide(b, pending.id, 'approve');
    await got.ended;
    t.ok(got.text.includes(CALL[format]), 'the call released once approved');
    t.ok(got.text.includes(END[format]), 'and the end of the answer');
    t.equal(got.text, await upstreamBytes(h, WIRE[format].path, got.body, got.headers), 'byte for byte');
    t.match((await decisionsOf(h, tool))[0], { outcome: 'allow', decided_by: 'admin-1', approval_id: pending.id });
  });
}

t.test('held past the keep-alive period: the format keep-alive, the stream open, then the call', async (t) => {
  // The first keep-alive goes out 15 s after the hold began (shortly after `started`).
  t.ok(
    await until(
      () => longHeld.every((got, i) => got.text.includes(KEEP_ALIVE[FORMATS[i]])),
      started + 30_000 - Date.now(),
    ),
    'a keep-alive on each stream',
  );
  t.ok(Date.now() - started >= 15_000, 'not before 15 s');
  for (const [i, format] of FORMATS.entries()) {
    const got = longHeld[i];
    t.equal(got.status, 200);
    t.notOk(got.done, `${format}: still open after ${Date.now() - started} ms`);
    t.ok(got.text.includes('Waiting for a person.'.split(' ')[0]), `${format}: the text came first`);
    t.ok(got.text.includes(KEEP_ALIVE[format]), `${format}: its keep-alive`);
    t.notOk(got.text.includes(CALL[format]), `${format}: the call still held`);
    const tool = `hold_${format.replace('-', '_')}_long`;
    await decide(b, (await pendingOf(b, tool)).id, 'approve', 'took a while');
    await got.ended;
    t.equal(
      got.text.split(KEEP_ALIVE[format]).join(''),
      await upstreamBytes(h, WIRE[format].path, got.body, got.headers),
      `${format}: the upstream's bytes, keep-alives aside`,
    );
    const [row] = await decisionsOf(h, tool);
    t.match(row, { outcome: 'allow', decided_by: 'admin-1' });
    t.ok(
      (row.held_ms as number) >= 10_000,
      `${format}: held ${row.held_ms} ms (the keep-alive counts from the call's first event)`,
    );
  }
});
