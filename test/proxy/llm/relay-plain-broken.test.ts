import http from 'node:http';
import type { AddressInfo } from 'node:net';
import t from 'tap';
import { ERRORS } from '../../../proxy/llm/errors.ts';
import { anthropicBody, baseSnapshot, post, recordAfter, startHarness } from '../../fixtures/llmproxy-harness.ts';

// A plain answer is held whole before anything of it leaves (steps/relay-plain.ts, read from its events:
// read-body.ts eachChunk): an upstream whose answer breaks off mid-body (its connection closed before
// the announced length) must not reach the agent as an answer. It is a 502 with its record, and the
// proxy serves the next call.

// An upstream that announces 1,000 bytes, sends 10 and closes its connection, unless asked for a
// whole answer (`x-whole: 1`).
const upstream = http.createServer((req, res) => {
  req.resume();
  req.on('end', () => {
    if (req.headers['x-whole'] === '1') {
      const body = JSON.stringify({
        id: 'msg_1',
        type: 'message',
        role: 'assistant',
        model: 'claude',
        content: [{ type: 'text', text: 'whole' }],
        usage: { input_tokens: 1, output_tokens: 1 },
      });
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
      res.end(body);
      return;
    }
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': '1000' });
    res.write('{"id":"msg');
    setTimeout(() => res.socket?.destroy(), 20);
  });
});
await new Promise<void>((resolve) => upstream.listen(0, '127.0.0.1', resolve));
const upstreamUrl = `http://127.0.0.1:${(upstream.address() as AddressInfo).port}`;
t.teardown(() => new Promise<void>((resolve) => upstream.close(() => resolve())));

const h = await startHarness({ snapshot: () => baseSnapshot(upstreamUrl) });
t.teardown(() => h.close());

t.test('an answer cut off mid-body is a 502 with its record, not a partial answer', async (t) => {
  const records = h.audit.length;
  const r = await post(h, '/v1/messages', anthropicBody('hi'));
  t.equal(r.status, ERRORS.upstreamFailed.status);
  t.equal(r.text, ERRORS.upstreamFailed.body.toString(), 'our answer, none of the upstream bytes');
  t.match(await recordAfter(h, records), {
    status: 502,
    upstream_status: 200,
    error: /^upstream response failed mid-body: /,
  });
});

t.test('the next call is served whole', async (t) => {
  const r = await post(h, '/v1/messages', anthropicBody('hi'), { 'x-whole': '1' });
  t.equal(r.status, 200);
  t.match(JSON.parse(r.text), { content: [{ text: 'whole' }] });
});
