import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import t from 'tap';
import { request } from 'undici';
import { silentLogger } from '../../../core/logger.ts';
import { createRegistry } from '../../../core/metrics.ts';
import type { Snapshot, WireFormat } from '../../../pipeline/policy/snapshot.ts';
import { CallContext, type ProxyDeps } from '../../../proxy/llm/context.ts';
import { proxyMetrics } from '../../../proxy/llm/metrics.ts';
import { LLMPROXY_DEFAULTS } from '../../../proxy/llm/options.ts';
import { relayStream } from '../../../proxy/llm/steps/relay-stream.ts';
import type { Decide } from '../../../proxy/llm/tools/types.ts';
import { readableAnswer } from '../../../proxy/llm/upstream.ts';
import { STREAMS } from './tools/stream-fixtures.ts';

// The stream relay step (steps/relay-stream.ts) with a tool Decide set, over real sockets: a node:http
// upstream serving provider streams, the relay step writing to a real agent connection (the official
// SDKs, or undici), the step alone: ctx.decideTool set by the test, everything from the upstream answer
// to the agent's socket the real path (translator, gate, final-event guard). The whole proxy with a
// decider: tool-calls-stream.test.ts.

const PATHS: Record<WireFormat, string> = {
  'anthropic-messages': '/v1/messages',
  'openai-chat': '/v1/chat/completions',
  'openai-responses': '/v1/responses',
};
const FORMAT_OF = Object.fromEntries(Object.entries(PATHS).map(([f, p]) => [p, f as WireFormat]));

// The upstream: streams in pieces of 50 bytes, 1 ms apart.
let upstreamFormat: WireFormat | null = null;
const upstream = http.createServer(async (req, res) => {
  for await (const _ of req);
  const bytes = Buffer.from(STREAMS[upstreamFormat ?? FORMAT_OF[req.url!]]());
  res.writeHead(200, { 'content-type': 'text/event-stream' });
  for (let i = 0; i < bytes.length && !res.destroyed; i += 50) {
    res.write(bytes.subarray(i, i + 50));
    await sleep(1);
  }
  res.end();
});

const deps = {
  options: { ...LLMPROXY_DEFAULTS },
  log: silentLogger(),
  metrics: proxyMetrics(createRegistry()),
  snapshot: () => ({}) as Snapshot,
} as unknown as ProxyDeps;

let decide: Decide | null = null;
const calls: CallContext[] = [];
// The agent-facing side: the relay step alone, after what forward() would have done.
const proxy = http.createServer(async (req, res) => {
  for await (const _ of req);
  const ctx = new CallContext(deps, req, res, req.url!);
  ctx.format = FORMAT_OF[req.url!];
  ctx.upstreamFormat = upstreamFormat ?? ctx.format;
  ctx.audit = true; // the final-event guard is on (no identity: no record)
  ctx.decideTool = decide;
  const abort = new AbortController();
  res.on('close', () => {
    if (!res.writableFinished) abort.abort();
  });
  const answer = await request(`${upstreamUrl}${PATHS[ctx.upstreamFormat]}`, {
    method: 'POST',
    body: '{}',
    signal: abort.signal,
  });
  ctx.answer = readableAnswer(answer, 'POST');
  await relayStream(ctx);
  calls.push(ctx);
});
for (const s of [upstream, proxy]) await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
const upstreamUrl = `http://127.0.0.1:${(upstream.address() as AddressInfo).port}`;
const proxyUrl = `http://127.0.0.1:${(proxy.address() as AddressInfo).port}`;
t.teardown(async () => {
  for (const s of [upstream, proxy]) {
    s.closeAllConnections();
    await new Promise<void>((r) => s.close(() => r()));
  }
});

const refuse =
  (name: string): Decide =>
  async (c) =>
    c.name === name ? { allow: false, message: `no ${c.name} (${c.id})` } : { allow: true, message: '' };
const raw = async (format: WireFormat) => {
  const res = await request(`${proxyUrl}${PATHS[format]}`, { method: 'POST', body: '{}' });
  return res.body.text();
};

t.test('without a Decide the stream is relayed as before; with one allowing all, byte for byte too', async (t) => {
  for (const format of Object.keys(PATHS) as WireFormat[]) {
    decide = null;
    t.equal(await raw(format), STREAMS[format](), `${format}: no gate`);
    decide = async () => ({ allow: true, message: '' });
    t.equal(await raw(format), STREAMS[format](), `${format}: gate, all allowed`);
  }
});

t.test('a refused call reaches the Anthropic SDK as text, the allowed one intact', async (t) => {
  decide = refuse('delete_files');
  const client = new Anthropic({ apiKey: 'k', baseURL: proxyUrl, maxRetries: 0 });
  const m = await client.messages
    .stream({ model: 'm', max_tokens: 10, messages: [{ role: 'user', content: 'hi' }] })
    .finalMessage();
  t.same(
    m.content.map((b) => (b.type === 'text' ? b.text : b.type === 'tool_use' ? b.name : b.type)),
    ['Checking.', 'get_weather', 'no delete_files (toolu_2)'],
  );
  t.equal(m.stop_reason, 'tool_use');
});

t.test('translated (Anthropic upstream, chat agent): the gate reads the agent’s format', async (t) => {
  upstreamFormat = 'anthropic-messages';
  t.teardown(() => {
    upstreamFormat = null;
  });
  decide = refuse('get_weather');
  const client = new OpenAI({ apiKey: 'k', baseURL: `${proxyUrl}/v1`, maxRetries: 0 });
  const c = await client.chat.completions
    .stream({ model: 'm', messages: [{ role: 'user', content: 'hi' }] })
    .finalChatCompletion();
  const msg = c.choices[0].message;
  t.match(msg.content, /^Checking\.\n\nno get_weather \(toolu_1\)$/);
  t.same(
    msg.tool_calls?.map((x) => x.type === 'function' && [x.function.name, x.function.arguments]),
    [['delete_files', '{"path":"/"}']],
  );
});

t.test('text reaches the agent before the held call is decided', async (t) => {
  let release!: () => void;
  const released = new Promise<void>((r) => {
    release = r;
  });
  decide = async () => {
    await released;
    return { allow: true, message: '' };
  };
  const res = await request(`${proxyUrl}/v1/responses`, { method: 'POST', body: '{}' });
  let got = '';
  for await (const chunk of res.body) {
    got += chunk.toString();
    if (got.includes('"delta":"Checking."') && !got.includes('function_call')) release();
  }
  t.equal(got, STREAMS['openai-responses'](), 'then the rest, byte for byte');
});

t.test('an agent leaving while a call is held ends the relay; no decision is awaited', async (t) => {
  const decided: string[] = [];
  decide = (c) => {
    decided.push(c.name);
    return new Promise(() => {}); // a person who never answers
  };
  const before = calls.length;
  const res = await request(`${proxyUrl}/v1/messages`, { method: 'POST', body: '{}' });
  let got = '';
  for await (const chunk of res.body) {
    got += chunk.toString();
    if (got.includes('Checking.')) break; // leaves: undici destroys the connection
  }
  for (let i = 0; i < 200 && calls.length === before; i++) await sleep(10);
  const ctx = calls.at(-1)!;
  t.equal(calls.length, before + 1, 'the relay step returned');
  t.match(ctx.error, /the agent closed the connection/);
  t.ok(ctx.res.destroyed);
  t.ok(decided.length <= 2);
});
