import t from 'tap';
import { request } from 'undici';
import { REPLY } from '../../fixtures/llm-upstream.ts';
import { anthropicBody, post, startHarness } from '../../fixtures/llmproxy-harness.ts';

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
