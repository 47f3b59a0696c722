import t from 'tap';
import Anthropic from '@anthropic-ai/sdk';
import { request } from 'undici';
import { startHarness } from '../../fixtures/llmproxy-harness.ts';
import { LLMPROXY_DEFAULTS, validateOptions } from '../../../proxy/llm/options.ts';

// A dead upstream (docs/decisions.md, "A dead upstream is cut, by two timers"): one that reads the request and never
// answers is cut at --upstream-timeout with the spec's 502; one that starts a stream and then goes silent is cut at
// --upstream-idle-timeout and the agent sees the stream end. Both are recorded and counted. The fixture's upstream is a
// real node:http server (`x-test-behavior: hang | stall`); the flags are small so the test is quick.
const h = await startHarness({ proxy: { upstreamTimeout: 400, upstreamIdleTimeout: 400, metricsAddr: '127.0.0.1:0' } });
t.teardown(() => h.close());

const body = (extra: Record<string, unknown> = {}) =>
  JSON.stringify({ model: 'claude-sonnet-4-5', max_tokens: 8, messages: [{ role: 'user', content: 'hi' }], ...extra });
const settle = () => new Promise((r) => setTimeout(r, 200));
const metrics = async () =>
  await (await request(`https://127.0.0.1:${h.proxy.metricsPort}/metrics`, { dispatcher: h.dispatcher })).body.text();

t.test('an upstream that accepts and never answers: 502 "Upstream request failed", recorded and counted', async (t) => {
  const r = await h.call('/v1/messages', {
    headers: { 'content-type': 'application/json', 'x-api-key': await h.token(), 'x-test-behavior': 'hang' },
    body: body(),
  });
  t.equal(r.status, 502);
  t.equal(r.text, 'Upstream request failed', "the spec's 502 body");
  t.equal(h.upstream.received.at(-1)!.headers['x-test-behavior'], 'hang', 'the upstream had the request');
  await settle();
  t.match(h.audit.at(-1), {
    org_id: 'org-1',
    agent_id: 'agent-1',
    status: 502,
    upstream_status: null,
    error: /upstream request failed: no response headers within 400 ms \(--upstream-timeout\)/,
  });
  t.match(await metrics(), /dvx_llmproxy_upstream_timeouts_total\{phase="headers"\} 1/);
  t.ok(
    h.logs.some(
      (l) => l.msg === 'upstream request failed' && l.timeout === 'headers' && (l.err as { stack?: string })?.stack,
    ),
    'logged with the error object',
  );
});

t.test('a stream that sends its first event and stalls is ended, recorded and counted', async (t) => {
  const res = await request(`${h.url}/v1/messages`, {
    method: 'POST',
    dispatcher: h.dispatcher,
    headers: { 'content-type': 'application/json', 'x-api-key': await h.token(), 'x-test-behavior': 'stall' },
    body: body({ stream: true }),
  });
  t.equal(res.statusCode, 200);
  let received = '';
  const err = await (async () => {
    for await (const chunk of res.body) received += String(chunk);
  })().then(
    () => null,
    (e: Error) => e,
  );
  t.match(received, /event: message_start/, 'the first event reached the agent');
  t.notMatch(received, /message_stop/);
  t.ok(err, 'the agent sees the stream cut short, not a stream left open');
  await settle();
  t.match(h.audit.at(-1), {
    status: 200,
    upstream_status: 200,
    error: /upstream stream failed: nothing received for 400 ms \(--upstream-idle-timeout\)/,
  });
  t.match(await metrics(), /dvx_llmproxy_upstream_timeouts_total\{phase="idle"\} 1/);
});

t.test('through the official SDK the agent gets a clean error, never a hang', async (t) => {
  const client = h.anthropic(await h.token());
  const plain = await client.messages
    .create(
      { model: 'claude-sonnet-4-5', max_tokens: 8, messages: [{ role: 'user', content: 'hi' }] },
      { headers: { 'x-test-behavior': 'hang' } },
    )
    .then(
      () => null,
      (e: Error) => e,
    );
  t.ok(plain instanceof Anthropic.APIError, 'a typed API error');
  t.equal((plain as InstanceType<typeof Anthropic.APIError>).status, 502);

  const stream = client.messages.stream(
    { model: 'claude-sonnet-4-5', max_tokens: 8, messages: [{ role: 'user', content: 'hi' }] },
    { headers: { 'x-test-behavior': 'stall' } },
  );
  const streamed = await stream.finalMessage().then(
    () => null,
    (e: Error) => e,
  );
  t.ok(streamed instanceof Error, `the stream's reader raises: ${streamed?.message}`);
});

t.test('a slow but live stream is not cut: each event restarts the idle timer', async (t) => {
  // Eight events 150 ms apart: the whole stream lasts three times the idle timeout, no gap reaches it.
  const r = await h.call('/v1/messages', {
    headers: { 'content-type': 'application/json', 'x-api-key': await h.token(), 'x-test-event-gap': '150' },
    body: body({ stream: true }),
  });
  t.equal(r.status, 200);
  t.match(r.text, /message_stop/);
  t.match(h.audit.at(-1), { status: 200, error: null });
});

t.test('defaults and validation', async (t) => {
  t.equal(LLMPROXY_DEFAULTS.upstreamTimeout, 600_000, "10 minutes: the SDKs' own wait for a plain answer");
  t.equal(LLMPROXY_DEFAULTS.upstreamIdleTimeout, 300_000);
  const base = { tlsCert: 'c', tlsKey: 'k', agentJwks: 'j' };
  t.throws(() => validateOptions({ ...base, upstreamTimeout: 0 }), /--upstream-timeout must be positive/);
  t.throws(() => validateOptions({ ...base, upstreamIdleTimeout: 0 }), /--upstream-idle-timeout must be positive/);
});
