import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { connect } from 'node:tls';
import t from 'tap';
import { request } from 'undici';
import { REPLY } from '../../fixtures/llm-upstream.ts';
import { anthropicBody, baseSnapshot, post, startHarness } from '../../fixtures/llmproxy-harness.ts';
import { until } from '../../fixtures/eventually.ts';

// The proxy's lifecycle around the steps: graceful shutdown finishes the call in flight; the
// metrics listener counts calls.

t.test('graceful shutdown finishes the call in flight', async (t) => {
  const g = await startHarness();
  const res = await request(`${g.url}/v1/messages`, {
    method: 'POST',
    dispatcher: g.dispatcher,
    headers: { 'content-type': 'application/json', 'x-api-key': await g.token() },
    body: anthropicBody('hi', { stream: true }),
  });
  const closing = g.close();
  const text = await res.body.text();
  t.match(text, /message_stop/, 'the stream ran to its end');
  t.ok(text.includes(REPLY.split(' ')[0]));
  await closing;
});

t.test('metrics on their own TLS listener', async (t) => {
  const m = await startHarness({ proxy: { metricsAddr: '127.0.0.1:0' } });
  t.teardown(() => m.close());
  await post(m, '/v1/messages', anthropicBody('hi'));
  await post(m, '/v1/messages', anthropicBody('key AKIAIOSFODNN7EXAMPLE'));
  const res = await request(`https://127.0.0.1:${m.proxy.metricsPort}/metrics`, { dispatcher: m.dispatcher });
  const text = await res.body.text();
  t.match(text, /dvx_llmproxy_requests_total\{format="anthropic-messages",status="200"\} 1/);
  t.match(text, /dvx_llmproxy_requests_total\{format="anthropic-messages",status="403"\} 1/);
  t.match(text, /dvx_llmproxy_overhead_seconds_count\{format="anthropic-messages"\} 2/);
  t.match(text, /dvx_llmproxy_upstream_seconds_count\{format="anthropic-messages"\} 1/);
  t.match(text, /dvx_inspection_findings_total\{inspector_type="api_key",severity="block"\} 1/);
});

t.test(
  'a call that reaches a draining proxy on an open connection is served, and that connection closed',
  async (t) => {
    // A rolling restart (cli/serve-workers.ts) drains a worker while its clients' connections are still
    // open: a client whose call was under way when the drain began sends its next call on the same
    // keep-alive connection. That call is served with `connection: close` (its client opens the next
    // connection elsewhere, on a live worker), not refused with a 503. A slow upstream holds calls.
    const holds = new Map<string, () => void>();
    const held = (name: string) => new Promise<void>((r) => holds.set(name, r));
    const waits = { 'hold A': held('hold A'), 'hold B': held('hold B') };
    let target = '';
    const slow = createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', async () => {
        const body = Buffer.concat(chunks);
        for (const [name, wait] of Object.entries(waits)) if (body.includes(name)) await wait;
        const forward = await request(`${target}${req.url}`, {
          method: 'POST',
          headers: { 'content-type': 'application/json', 'x-api-key': String(req.headers['x-api-key'] ?? '') },
          body,
        });
        res.writeHead(forward.statusCode, { 'content-type': 'application/json' });
        res.end(Buffer.from(await forward.body.arrayBuffer()));
      });
    });
    await new Promise<void>((r) => slow.listen(0, '127.0.0.1', r));
    t.teardown(() => slow.close());
    const g = await startHarness({
      snapshot: (url) => {
        target = url;
        return baseSnapshot(`http://127.0.0.1:${(slow.address() as AddressInfo).port}`);
      },
    });
    const token = await g.token();
    const inFlight = request(`${g.url}/v1/messages`, {
      method: 'POST',
      dispatcher: g.dispatcher,
      headers: { 'content-type': 'application/json', 'x-api-key': token },
      body: anthropicBody('hold A'),
    });
    const url = new URL(g.url);
    const socket = connect({ host: url.hostname, port: Number(url.port), ca: g.ca.certPem });
    await new Promise<void>((r) => socket.once('secureConnect', () => r()));
    const call = (text: string) => {
      const body = anthropicBody(text);
      return `POST /v1/messages HTTP/1.1\r\nhost: ${url.host}\r\ncontent-type: application/json\r\nx-api-key: ${token}\r\ncontent-length: ${Buffer.byteLength(body)}\r\n\r\n${body}`;
    };
    let answers = '';
    socket.on('data', (c: Buffer) => (answers += c.toString('latin1')));
    const ended = new Promise<void>((r) => socket.once('close', () => r()));
    const count = () => (answers.match(/HTTP\/1\.1 /g) ?? []).length;
    socket.write(call('hold B'));
    t.ok(await until(() => g.proxy.proxy.inFlight === 2), 'two calls in flight');
    const closing = g.close();
    holds.get('hold B')!();
    t.ok(await until(() => count() === 1), 'the first call on the connection was answered');
    t.match(answers, /connection: keep-alive/i, 'begun before the drain: its connection was kept');
    socket.write(call('the next call on the same connection'));
    t.ok(await until(() => count() === 2), 'the next call was answered');
    await ended;
    const statuses = [...answers.matchAll(/HTTP\/1\.1 (\d{3})/g)].map((m) => m[1]);
    t.same(statuses, ['200', '200'], 'served during the drain, not refused');
    t.match(
      answers.slice(answers.lastIndexOf('HTTP/1.1 ')),
      /connection: close/i,
      'and its connection closed after it',
    );
    holds.get('hold A')!();
    t.equal((await inFlight).statusCode, 200, 'the other call in flight finished');
    await closing;
  },
);
