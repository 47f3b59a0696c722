import http from 'node:http';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { type Agent, request } from 'undici';
import { listenLocal } from './fixtures.ts';
import { formatMs, measure, table } from './measure.ts';
import { median } from './stats.ts';

// The proxy benchmark's tool-call profile (npm run bench -- proxy): what deciding an answer's tool calls
// costs. A mock Anthropic upstream answers every call with text and two tool calls (plain JSON, or a
// stream: a text delta, then the calls as input_json_delta pieces). Contenders: direct, the floor,
// dvx without a tool policy and dvx with one (three rules, none of which refuses these calls, so every
// call is evaluated, recorded and delivered). Content inspection is off in both dvx runs: the table
// isolates the tool layer. Measured: the plain answer's latency (closed loop, one call at a time), the
// streamed answer's time to its first text delta (the policy must not delay text) and to its first
// tool call (held until decided).

const PLAIN = JSON.stringify({
  id: 'msg_bench',
  type: 'message',
  role: 'assistant',
  model: 'claude-sonnet-4-5',
  stop_reason: 'tool_use',
  stop_sequence: null,
  content: [
    { type: 'text', text: 'Looking it up.' },
    { type: 'tool_use', id: 'toolu_b1', name: 'get_weather', input: { city: 'Paris', unit: 'c' } },
    { type: 'tool_use', id: 'toolu_b2', name: 'search_docs', input: { query: 'quarterly report', limit: 5 } },
  ],
  usage: { input_tokens: 40, output_tokens: 30 },
});

const event = (name: string, data: unknown) => `event: ${name}\ndata: ${JSON.stringify(data)}\n\n`;
const STREAM_HEAD =
  event('message_start', {
    type: 'message_start',
    message: {
      id: 'msg_bench_s',
      type: 'message',
      role: 'assistant',
      model: 'claude-sonnet-4-5',
      content: [],
      stop_reason: null,
      stop_sequence: null,
      usage: { input_tokens: 40, output_tokens: 1 },
    },
  }) +
  event('content_block_start', { type: 'content_block_start', index: 0, content_block: { type: 'text', text: '' } }) +
  event('content_block_delta', {
    type: 'content_block_delta',
    index: 0,
    delta: { type: 'text_delta', text: 'Looking it up.' },
  });
const STREAM_TOOLS =
  event('content_block_stop', { type: 'content_block_stop', index: 0 }) +
  [
    ['toolu_b1', 'get_weather', '{"city": "Paris", "unit": "c"}'],
    ['toolu_b2', 'search_docs', '{"query": "quarterly report", "limit": 5}'],
  ]
    .map(
      ([id, name, args], i) =>
        event('content_block_start', {
          type: 'content_block_start',
          index: i + 1,
          content_block: { type: 'tool_use', id, name, input: {} },
        }) +
        [args.slice(0, 10), args.slice(10)]
          .map((partial_json) =>
            event('content_block_delta', {
              type: 'content_block_delta',
              index: i + 1,
              delta: { type: 'input_json_delta', partial_json },
            }),
          )
          .join('') +
        event('content_block_stop', { type: 'content_block_stop', index: i + 1 }),
    )
    .join('') +
  event('message_delta', {
    type: 'message_delta',
    delta: { stop_reason: 'tool_use', stop_sequence: null },
    usage: { output_tokens: 30 },
  }) +
  event('message_stop', { type: 'message_stop' });

/** The upstream of this profile: plain answers at once; a stream's tool calls 5 ms after its text. */
export function startToolUpstream(): Promise<{ url: string; close: () => void }> {
  return listenLocal(
    http.createServer((req, res) => {
      let streamed = false;
      req.on('data', (c: Buffer) => {
        if (!streamed && c.includes('"stream":true')) streamed = true;
      });
      req.on('end', () => {
        if (!streamed) {
          res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(PLAIN) });
          res.end(PLAIN);
          return;
        }
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.write(STREAM_HEAD);
        setTimeout(() => res.end(STREAM_TOOLS), 5);
      });
    }),
  );
}

/** The llm_policy of the "policy on" run: evaluated for every call, refusing none of this profile's. */
export const BENCH_TOOL_POLICY = {
  inspection: {
    inspectors: [
      {
        name: 'bench',
        rules: [
          { tool: 'delete_*', verdict: 'deny', summary: 'no deletions' },
          { tool: 'transfer', verdict: 'require_approval', summary: 'money', arg_gt: { amount: 100 } },
          { tool: 'get_*', verdict: 'allow', model_match: 'claude-*' },
        ],
      },
    ],
  },
};

/** A snapshot for the profile's dvx runs: inspection off, the tool policy on or not. */
export function toolSnapshot(upstreamUrl: string, policy: boolean): Record<string, unknown> {
  return {
    version: 'bench-tools',
    enclave: { id: 'e', name: 'bench', isolation_class: 'vm' },
    platform: { downstream_url: { value: upstreamUrl } },
    orgs: {
      'org-b': {
        flags: { 'inspect:llm': false, 'audit:llm': true },
        config: policy ? { llm_policy: { value: BENCH_TOOL_POLICY } } : {},
      },
    },
    agents: {},
  };
}

export async function writeToolSnapshots(dir: string, upstreamUrl: string): Promise<{ off: string; on: string }> {
  const off = join(dir, 'snap-tools-off.json');
  const on = join(dir, 'snap-tools-on.json');
  await writeFile(off, JSON.stringify(toolSnapshot(upstreamUrl, false)));
  await writeFile(on, JSON.stringify(toolSnapshot(upstreamUrl, true)));
  return { off, on };
}

export interface ToolContender {
  name: string;
  url: string;
  headers: Record<string, string>;
  dispatcher: Agent;
  /** The profile's "added" column is over this one (direct). */
  baseline?: boolean;
}

const ASK = JSON.stringify({
  model: 'claude-sonnet-4-5',
  max_tokens: 64,
  messages: [{ role: 'user', content: 'What is the weather in Paris, and find the quarterly report.' }],
});
const ASK_STREAM = JSON.stringify({ ...JSON.parse(ASK), stream: true });

async function firstMarks(c: ToolContender): Promise<{ text: number; tool: number }> {
  const t0 = performance.now();
  const res = await request(`${c.url}/v1/messages`, {
    method: 'POST',
    headers: c.headers,
    body: ASK_STREAM,
    dispatcher: c.dispatcher,
  });
  let text = 0;
  let tool = 0;
  for await (const chunk of res.body) {
    const s = String(chunk);
    if (!text && s.includes('text_delta')) text = performance.now() - t0;
    if (!tool && s.includes('"tool_use"')) tool = performance.now() - t0;
  }
  return { text, tool };
}

/** Runs the profile over the contenders (started by the caller) and returns its table. */
export async function toolCallProfile(contenders: ToolContender[], quick: boolean): Promise<string> {
  const rows: string[][] = [];
  let direct = NaN;
  let floorAdded = NaN;
  for (const c of contenders) {
    const plain = await measure(
      async () => {
        const res = await request(`${c.url}/v1/messages`, {
          method: 'POST',
          headers: c.headers,
          body: ASK,
          dispatcher: c.dispatcher,
        });
        const body = await res.body.text();
        if (res.statusCode !== 200 || !body.includes('toolu_b2'))
          throw new Error(`${c.name}: answered ${res.statusCode}`);
      },
      { budgetMs: quick ? 1500 : 5000, warmup: 200 },
    );
    const marks: { text: number; tool: number }[] = [];
    for (let i = 0; i < (quick ? 20 : 100); i++) marks.push(await firstMarks(c));
    if (c.baseline) direct = plain.p50;
    const added = plain.p50 - direct;
    if (c.name.startsWith('floor')) floorAdded = added;
    rows.push([
      c.name,
      formatMs(plain.p50),
      formatMs(plain.p99),
      c.baseline ? '' : formatMs(Math.max(0, added)),
      c.baseline || !(floorAdded > 0) ? '' : `${(added / floorAdded).toFixed(2)}×`,
      formatMs(median(marks.map((m) => m.text))),
      formatMs(median(marks.map((m) => m.tool))),
      String(plain.n),
    ]);
  }
  return table(
    [
      'contender (answer: text + 2 tool calls)',
      'plain p50',
      'plain p99',
      'p50 added over direct',
      'added / floor added',
      'stream: first text (p50)',
      'stream: first tool call (p50)',
      'runs',
    ],
    rows,
  );
}
