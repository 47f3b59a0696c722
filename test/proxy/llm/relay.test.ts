import t from 'tap';
import { request } from 'undici';
import { AGENT_SECRET, anthropicBody, post, recordAfter, startHarness } from '../../fixtures/llmproxy-harness.ts';

// The relay steps: a stream that breaks mid-way, and the response pipeline, observe-only, over
// plain and streamed answers.
const h = await startHarness();
t.teardown(() => h.close());

t.test('a stream that breaks mid-way reaches the agent as a broken stream and is audited', async (t) => {
  const records = h.audit.length;
  const res = await request(`${h.url}/v1/messages`, {
    method: 'POST',
    dispatcher: h.dispatcher,
    headers: { 'content-type': 'application/json', 'x-api-key': await h.token(), 'x-test-behavior': 'reset' },
    body: anthropicBody('hi', { stream: true }),
  });
  t.equal(res.statusCode, 200);
  const err = await res.body.text().then(
    () => null,
    (e: Error) => e,
  );
  t.ok(err, 'the agent sees the break');
  t.match(await recordAfter(h, records), { format: 'anthropic-messages', error: /upstream stream failed/ });
});

t.test('response inspection is observe-only: a leak in the answer is recorded, the answer delivered', async (t) => {
  const leak = `the password is ${AGENT_SECRET} ok`;
  const plain = await post(h, '/v1/messages', anthropicBody('hi'), { 'x-test-reply': leak });
  t.equal(plain.status, 200);
  t.match(JSON.parse(plain.text).content[0].text, leak);
  t.match(h.audit.at(-1), {
    status: 200,
    findings: [{ inspector_type: 'secrets', severity: 'block', location: 'response_body', match: 'hunt****' }],
  });
  const records = h.audit.length;
  const streamed = await post(h, '/v1/messages', anthropicBody('hi', { stream: true }), { 'x-test-reply': leak });
  t.equal(streamed.status, 200);
  t.match(streamed.text, /message_stop/);
  t.match(
    await recordAfter(h, records),
    { findings: [{ inspector_type: 'secrets', location: 'response_body' }] },
    'found across stream deltas',
  );
});
