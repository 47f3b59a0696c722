import http from 'node:http';
import type { AddressInfo } from 'node:net';
import t, { type Test } from 'tap';
import { request } from 'undici';
import { createRegistry } from '../../../core/metrics.ts';
import { InspectionEngine } from '../../../pipeline/engine.ts';
import { policyFromDocument } from '../../../pipeline/policy/resolve.ts';
import { validatePolicyDocument } from '../../../pipeline/policy/validate.ts';
import { AGENT_SECRET, baseSnapshot, startHarness } from '../../fixtures/llmproxy-harness.ts';

// A streamed answer inspected as it arrives, end to end: a real node:http upstream streams Anthropic,
// OpenAI chat and OpenAI responses SSE (leaks split across deltas, blocks, the proxy's checkpoints,
// and tool-call argument fragments with an escape split across two), through llmproxy, read by the
// official SDKs. The record's findings are those the whole body scanned at the end gives (the same
// engine's inspect over the same bytes), and the scans ran while the stream passed (the metric).

const CONTENT = {
  secrets_filter: { enabled: true },
  pii_detection: { enabled: true, severity: 'warn' },
  api_key_detection: { enabled: true, severity: 'block' },
  patterns: [{ pattern: 'nightingale-[0-9]{3}', description: 'codename', severity: 'warn' }],
};
const FILLER = 'The quick brown fox jumps over the lazy dog, again and again; ';

type Format = 'anthropic' | 'chat' | 'responses';

/** The answer: a text block with leaks split across deltas, then a tool call whose arguments carry more. */
function answer(format: Format): string {
  const out: string[] = [];
  const ev = (name: string | null, data: unknown) =>
    out.push(`${name ? `event: ${name}\n` : ''}data: ${JSON.stringify(data)}\n\n`);
  const text = (d: string) => {
    if (format === 'anthropic')
      ev('content_block_delta', { type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text: d } });
    else if (format === 'chat')
      ev(null, {
        id: 'c1',
        object: 'chat.completion.chunk',
        created: 1,
        model: 'gpt-4o',
        choices: [{ index: 0, delta: { content: d }, finish_reason: null }],
      });
    else
      ev('response.output_text.delta', {
        type: 'response.output_text.delta',
        item_id: 'msg_1',
        output_index: 0,
        content_index: 0,
        delta: d,
      });
  };
  const args = (d: string) => {
    if (format === 'anthropic')
      ev('content_block_delta', {
        type: 'content_block_delta',
        index: 1,
        delta: { type: 'input_json_delta', partial_json: d },
      });
    else if (format === 'chat')
      ev(null, {
        id: 'c1',
        object: 'chat.completion.chunk',
        created: 1,
        model: 'gpt-4o',
        choices: [{ index: 0, delta: { tool_calls: [{ index: 0, function: { arguments: d } }] }, finish_reason: null }],
      });
    else
      ev('response.function_call_arguments.delta', {
        type: 'response.function_call_arguments.delta',
        item_id: 'fc_1',
        output_index: 1,
        delta: d,
      });
  };
  if (format === 'anthropic') {
    ev('message_start', {
      type: 'message_start',
      message: {
        id: 'msg_1',
        type: 'message',
        role: 'assistant',
        model: 'claude-sonnet-4-5',
        content: [],
        stop_reason: null,
        usage: { input_tokens: 5, output_tokens: 0 },
      },
    });
    ev('content_block_start', { type: 'content_block_start', index: 0, content_block: { type: 'text', text: '' } });
  } else if (format === 'responses') {
    ev('response.created', {
      type: 'response.created',
      response: { id: 'resp_1', object: 'response', status: 'in_progress', output: [] },
    });
  }
  // ~300 KB of text: several checkpoints; the leaks at its start, middle and end, split across deltas.
  const leaks = ['night', 'ingale-101 ', AGENT_SECRET.slice(0, 7), `${AGENT_SECRET.slice(7)} `];
  for (let i = 0; i < 5000; i++) {
    if (i % 2000 === 0) for (const l of leaks) text(l);
    text(FILLER);
  }
  for (const l of leaks) text(l);
  if (format === 'anthropic') {
    ev('content_block_stop', { type: 'content_block_stop', index: 0 });
    ev('content_block_start', {
      type: 'content_block_start',
      index: 1,
      content_block: { type: 'tool_use', id: 'tu_1', name: 'note', input: {} },
    });
  } else if (format === 'responses') {
    ev('response.output_text.done', {
      type: 'response.output_text.done',
      item_id: 'msg_1',
      output_index: 0,
      content_index: 0,
      text: '',
    });
  }
  // The secret in the arguments with its `-` written `\u002d`, the escape split across two fragments.
  const [a, b] = AGENT_SECRET.split('-agent');
  for (const d of ['{"text":"', a, '\\u00', '2dagent', b, ' nightingale-', '202"}']) args(d);
  if (format === 'anthropic') {
    ev('content_block_stop', { type: 'content_block_stop', index: 1 });
    ev('message_delta', { type: 'message_delta', delta: { stop_reason: 'tool_use' }, usage: { output_tokens: 9 } });
    ev('message_stop', { type: 'message_stop' });
  } else if (format === 'chat') {
    ev(null, {
      id: 'c1',
      object: 'chat.completion.chunk',
      created: 1,
      model: 'gpt-4o',
      choices: [{ index: 0, delta: {}, finish_reason: 'tool_calls' }],
    });
    out.push('data: [DONE]\n\n');
  } else {
    ev('response.completed', {
      type: 'response.completed',
      response: { id: 'resp_1', object: 'response', status: 'completed', output: [] },
    });
  }
  return out.join('');
}

const answers: Record<Format, Buffer> = {
  anthropic: Buffer.from(answer('anthropic')),
  chat: Buffer.from(answer('chat')),
  responses: Buffer.from(answer('responses')),
};

// The upstream: the answer of the path's format, in 8 KB chunks, a pause every few.
const upstream = http.createServer((req, res) => {
  req.resume();
  req.on('end', async () => {
    const format: Format = req.url!.includes('/chat/')
      ? 'chat'
      : req.url!.includes('/responses')
        ? 'responses'
        : 'anthropic';
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    const body = answers[format];
    for (let at = 0, i = 0; at < body.length; at += 8192, i++) {
      res.write(body.subarray(at, at + 8192));
      if (i % 4 === 0) await new Promise((r) => setTimeout(r, 2));
    }
    res.end();
  });
});
await new Promise<void>((r) => upstream.listen(0, '127.0.0.1', r));
const upstreamUrl = `http://127.0.0.1:${(upstream.address() as AddressInfo).port}`;
t.teardown(() => new Promise((r) => upstream.close(r)));

const h = await startHarness({
  snapshot: () => {
    const s = baseSnapshot(upstreamUrl) as { orgs: Record<string, { config: Record<string, unknown> }> };
    s.orgs['org-1'].config.content_inspection = { value: CONTENT };
    return s;
  },
  proxy: { metricsAddr: '127.0.0.1:0' },
});
t.teardown(() => h.close());

const policy = policyFromDocument(validatePolicyDocument({ content_inspection: CONTENT }));
const wholeEngine = new InspectionEngine({ registry: createRegistry(), threads: 0 });
t.teardown(() => wholeEngine.close());

const keyOf = (f: Record<string, unknown>) => `${f.inspector_type}|${f.severity}|${f.description}|${f.match}`;

async function checkpoints(): Promise<number> {
  const res = await request(`https://127.0.0.1:${h.proxy.metricsPort}/metrics`, { dispatcher: h.dispatcher });
  const text = await res.body.text();
  let n = 0;
  for (const m of text.matchAll(/^dvx_inspection_stream_checkpoints_total\{[^}]*\} (\d+)/gm)) n += Number(m[1]);
  return n;
}

async function expectWhole(t: Test, format: Format): Promise<void> {
  const whole = await wholeEngine.inspect({
    body: answers[format],
    phase: 'response',
    policy,
    secrets: [AGENT_SECRET],
  });
  const record = h.audit.at(-1)!;
  const findings = (record.findings as Record<string, unknown>[]).map(keyOf).sort();
  t.strictSame(
    findings,
    whole.findings.map((f) => keyOf(f as never)).sort(),
    `${format}: the whole-body scan's findings`,
  );
  t.ok(
    findings.some((f) => f.startsWith('secrets|')),
    `${format}: the secret split across deltas`,
  );
  t.ok(
    findings.some((f) => f.includes('codename|nigh****')),
    `${format}: the codename split across deltas`,
  );
  t.equal(record.inspection_failopen, false);
}

t.test('anthropic: the SDK reads the stream; the record holds the whole scan findings', async (t) => {
  // Twice: the first call starts the inspection pool (its workers load while that stream passes).
  for (const round of ['cold pool', 'warm pool']) {
    const before = await checkpoints();
    const client = h.anthropic(await h.token());
    const stream = client.messages.stream({
      model: 'claude-sonnet-4-5',
      max_tokens: 64,
      messages: [{ role: 'user', content: 'hi' }],
    });
    let text = '';
    stream.on('text', (d) => (text += d));
    await stream.finalMessage();
    t.ok(text.length > 300_000, 'the whole answer arrived');
    await expectWhole(t, 'anthropic');
    const after = await checkpoints();
    t.ok(
      after - before >= (round === 'cold pool' ? 1 : 3),
      `${round}: stretches scanned while the stream passed (${after - before})`,
    );
  }
});

t.test('openai chat: the same', async (t) => {
  const before = await checkpoints();
  const client = h.openai(await h.token());
  const stream = await client.chat.completions.create({
    model: 'gpt-4o',
    messages: [{ role: 'user', content: 'hi' }],
    stream: true,
  });
  let text = '';
  for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
  t.ok(text.length > 300_000);
  await expectWhole(t, 'chat');
  t.ok((await checkpoints()) - before >= 3);
});

t.test('openai responses: the same', async (t) => {
  const before = await checkpoints();
  const client = h.openai(await h.token());
  const stream = await client.responses.create({ model: 'gpt-4o', input: 'hi', stream: true });
  let text = '';
  for await (const event of stream) if (event.type === 'response.output_text.delta') text += event.delta;
  t.ok(text.length > 300_000);
  await expectWhole(t, 'responses');
  t.ok((await checkpoints()) - before >= 3);
});
