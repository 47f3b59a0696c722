import t from 'tap';
import fc from 'fast-check';
import { createRegistry } from '../../core/metrics.ts';
import { InspectionEngine } from '../../pipeline/engine.ts';
import { compilePlan } from '../../pipeline/plan.ts';
import { findingKey, type ScanResult } from '../../pipeline/scan.ts';
import { SseJoiner, sseText } from '../../pipeline/sse-text.ts';
import { StreamInspection } from '../../pipeline/stream-inspection.ts';
import { scanStretch } from '../../pipeline/stream-scan.ts';
import { sseTextReference } from './sse-text.reference.ts';
import { builtinsWith } from './policy-fixture.ts';
import { pooledPolicy } from '../../pipeline/pooled-policy.ts';

// A streamed response inspected as it arrives gives what the whole body scanned at the end gives:
// over random streams (Anthropic, OpenAI chat and responses; leaks split across deltas, blocks and
// checkpoints, tool-call arguments with escapes split across fragments), random chunkings and random
// checkpoint sizes, the incremental findings and failures equal the whole-body scan's.

const splittable = builtinsWith([
  { pattern: 'nightingale-[0-9]{3}', description: 'codename', severity: 'warn' },
  { pattern: 'ticket:[0-9]{4}', description: 'ticket', severity: 'log' },
  { pattern: '[0-9]{4}-marker', description: 'marker', severity: 'log' },
]);
// A pattern that can span two blocks (and one anchored): the joined text is then scanned whole at the end.
const spanning = builtinsWith([
  { pattern: '(?s)password.{0,40}hunter2', description: 'spanning', severity: 'warn' },
  { pattern: '^lead', description: 'anchored', severity: 'log' },
  { pattern: 'end$', description: 'anchored end', severity: 'log' },
  { pattern: '[0-9]{4}-marker', description: 'marker', severity: 'log' },
]);
const SECRETS = ['zebra-crossing-42', 'Tr0ub4dor&3-horse'];

const LEAKS = [
  'sk-ant-api03-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789AbCdEfGhIjKlMnOp',
  'AKIAIOSFODNN7EXAMPLE',
  'mail jane.doe@example.com now',
  'card 4111 1111 1111 1111',
  'zebra-crossing-42',
  'Tr0ub4dor&3-horse',
  'nightingale-123',
  'ticket:4321',
  'password is hunter2',
  'password',
  'hunter2 end',
  'end',
  'lead text',
  'caf\u00e9 \u200bzebra-\u200bcrossing-42',
];
const FILLER = 'The quick brown fox jumps over the lazy dog; ';
const LINE_FILLER = 'The quick brown fox jumps over the lazy dog;\n';

type Format = 'anthropic' | 'chat' | 'responses';

/** An SSE stream of `blocks` (each a list of deltas; `json` blocks are tool-call arguments). */
function stream(format: Format, blocks: { deltas: string[]; json: boolean }[], comments: number[] = []): string {
  const out: string[] = [];
  const ev = (name: string | null, data: unknown) =>
    out.push(`${name ? `event: ${name}\n` : ''}data: ${JSON.stringify(data)}\n\n`);
  blocks.forEach((b, i) => {
    for (const d of b.deltas) {
      if (format === 'anthropic')
        ev('content_block_delta', {
          type: 'content_block_delta',
          index: i,
          delta: b.json ? { type: 'input_json_delta', partial_json: d } : { type: 'text_delta', text: d },
        });
      else if (format === 'chat')
        ev(null, {
          choices: [
            {
              index: 0,
              delta: b.json ? { tool_calls: [{ index: i, function: { arguments: d } }] } : { content: d },
            },
          ],
        });
      else
        ev(b.json ? 'response.function_call_arguments.delta' : 'response.output_text.delta', {
          type: b.json ? 'response.function_call_arguments.delta' : 'response.output_text.delta',
          item_id: `item_${i}`,
          output_index: i,
          ...(b.json ? {} : { content_index: 0 }),
          delta: d,
        });
    }
    out.push(`: ${comments[i % Math.max(1, comments.length)] ?? 0}-marker ${FILLER.repeat(i * 20)}\n\n`);
    if (format === 'anthropic') ev('content_block_stop', { type: 'content_block_stop', index: i });
    else if (format === 'responses')
      ev(b.json ? 'response.function_call_arguments.done' : 'response.output_text.done', {
        type: b.json ? 'response.function_call_arguments.done' : 'response.output_text.done',
        item_id: `item_${i}`,
        output_index: i,
        ...(b.json ? {} : { content_index: 0 }),
      });
  });
  if (format === 'chat') ev(null, { choices: [{ index: 0, delta: {}, finish_reason: 'stop' }] });
  if (format === 'anthropic') ev('message_stop', { type: 'message_stop' });
  if (format === 'chat') out.push('data: [DONE]\n\n');
  return out.join('');
}

/** Text cut into deltas at the given positions. */
function cutAt(text: string, cuts: number[]): string[] {
  const at = [...new Set(cuts.map((c) => c % (text.length + 1)))].sort((a, b) => a - b);
  const out: string[] = [];
  let from = 0;
  for (const c of at) {
    if (c > from) out.push(text.slice(from, c));
    from = Math.max(from, c);
  }
  out.push(text.slice(from));
  return out.filter((s) => s.length > 0);
}

const keys = (r: { findings: ScanResult['findings'] }) => r.findings.map(findingKey).sort();
const failures = (r: { failures: ScanResult['failures'] }) =>
  r.failures.map((f) => `${f.inspector}:${f.reason}`).sort();

// A marker of its own per leak (its finding's match, the first 4 characters, tells it apart).
const leakArb = fc.oneof(
  fc.constantFrom(...LEAKS),
  fc.integer({ min: 1000, max: 9999 }).map((n) => `${n}-marker`),
);
const blockArb = fc.record({
  leaks: fc.array(leakArb, { maxLength: 4 }),
  filler: fc.oneof(fc.constant(0), fc.integer({ min: 0, max: 200 })),
  cuts: fc.array(fc.nat(), { maxLength: 12 }),
  json: fc.boolean(),
  // Text in lines (a long text block is scanned in lines while it is open).
  newlines: fc.boolean(),
});

const caseArb = fc.record({
  format: fc.constantFrom<Format>('anthropic', 'chat', 'responses'),
  blocks: fc.array(blockArb, { minLength: 1, maxLength: 5 }),
  // Lines only the body as sent holds (an SSE comment after each block): a stretch of the body left
  // unscanned loses them, which the joined text cannot make up for.
  comments: fc.array(fc.integer({ min: 1000, max: 9999 }), { minLength: 1, maxLength: 5 }),
  chunks: fc.array(fc.integer({ min: 1, max: 9000 }), { minLength: 1, maxLength: 40 }),
  checkpoint: fc.integer({ min: 3000, max: 20_000 }),
  policy: fc.constantFrom(splittable, spanning),
});

type Case = typeof caseArb extends fc.Arbitrary<infer C> ? C : never;

function build(c: Case): Buffer {
  const blocks = c.blocks.map((b) => {
    const filler = b.newlines ? LINE_FILLER : FILLER;
    const text = [filler.repeat(b.filler), ...b.leaks, filler.repeat(b.filler >> 1)]
      .filter((x) => x)
      .join(b.newlines ? '\n' : ' ');
    const body = b.json ? JSON.stringify({ note: text, path: 'C:\\dir\\\u00e9' }) : text;
    return { deltas: cutAt(body, b.cuts), json: b.json };
  });
  return Buffer.from(stream(c.format, blocks, c.comments));
}

async function incremental(
  c: Case,
  body: Buffer,
): Promise<{ result: ScanResult; checkpoints: number; kinds: Set<string> }> {
  const plan = compilePlan(c.policy);
  let checkpoints = 0;
  const kinds = new Set<string>();
  const inspection = new StreamInspection(
    plan,
    c.policy,
    SECRETS,
    async (task) => scanStretch(plan, { ...task, policy: pooledPolicy(c.policy), secrets: SECRETS }),
    (kind) => {
      checkpoints++;
      kinds.add(kind);
    },
    c.checkpoint,
  );
  let at = 0;
  for (let i = 0; at < body.length; i++) {
    const n = c.chunks[i % c.chunks.length];
    inspection.push(body.subarray(at, at + n));
    at += n;
    // Let the scans run between chunks sometimes, as they do while a stream passes.
    if (i % 3 === 0) await new Promise((r) => setImmediate(r));
  }
  return { result: await inspection.finish(), checkpoints, kinds };
}

t.test('the incremental joiner reads what the whole-body sseText read', async (t) => {
  fc.assert(
    fc.property(caseArb, fc.array(fc.integer({ min: 1, max: 500 }), { minLength: 1, maxLength: 20 }), (c, chunks) => {
      const body = build(c);
      const expected = sseTextReference(body);
      t.strictSame(sseText(body), expected);
      // Fed in chunks, as the stream arrives.
      const joiner = new SseJoiner();
      for (let at = 0, i = 0; at < body.length; i++) {
        const n = chunks[i % chunks.length];
        joiner.push(body.subarray(at, at + n));
        at += n;
      }
      joiner.end();
      t.strictSame(joiner.joined(), expected);
    }),
    { numRuns: 200 },
  );
  // Lines JSON.parse refuses, past the bound: both give up the same way.
  const bad = Buffer.from(`${'data: {"delta": nope}\n'.repeat(1100)}data: {"delta":{"text":"x"}}\n`);
  let gaveUp = 0;
  t.strictSame(
    sseText(bad, () => gaveUp++),
    sseTextReference(bad),
  );
  t.equal(gaveUp, 1);
});

t.test('a stream inspected as it arrives finds what the whole body scanned at the end finds', async (t) => {
  const engine = new InspectionEngine({ registry: createRegistry(), threads: 0 });
  t.teardown(() => engine.close());
  let withCheckpoints = 0;
  const kindsSeen = { bytes: 0, joined: 0 };
  await fc.assert(
    fc.asyncProperty(caseArb, async (c) => {
      const body = build(c);
      const whole = await engine.inspect({ body, phase: 'response', policy: c.policy, secrets: SECRETS });
      const { result, checkpoints, kinds } = await incremental(c, body);
      if (checkpoints > 0) withCheckpoints++;
      if (kinds.has('bytes')) kindsSeen.bytes++;
      if (kinds.has('joined')) kindsSeen.joined++;
      t.strictSame(keys(result), keys(whole), `findings (${c.format})`);
      t.strictSame(failures(result), failures(whole), 'failures');
    }),
    { numRuns: 150 },
  );
  t.ok(withCheckpoints > 20, `checkpoints ran during the streams (${withCheckpoints} of 150 runs)`);
  t.ok(kindsSeen.bytes > 10 && kindsSeen.joined > 10, `both kinds ran: ${JSON.stringify(kindsSeen)}`);
});

t.test('a block that grows after its stop event is scanned again, whole, at the end', async (t) => {
  const engine = new InspectionEngine({ registry: createRegistry(), threads: 0 });
  t.teardown(() => engine.close());
  const ev = (data: unknown) => `data: ${JSON.stringify(data)}\n\n`;
  const delta = (index: number, text: string) =>
    ev({ type: 'content_block_delta', index, delta: { type: 'text_delta', text } });
  const body = Buffer.from(
    delta(0, 'night') +
      delta(1, 'other block') +
      ev({ type: 'content_block_stop', index: 0 }) +
      `: ${FILLER.repeat(200)}\n\n` +
      delta(0, 'ingale-1') +
      delta(0, '23 end'),
  );
  const c = {
    format: 'anthropic' as const,
    blocks: [],
    comments: [],
    chunks: [64],
    checkpoint: 3000,
    policy: splittable,
  };
  const whole = await engine.inspect({ body, phase: 'response', policy: splittable, secrets: SECRETS });
  const { result, checkpoints } = await incremental(c, body);
  t.ok(checkpoints > 0);
  t.strictSame(keys(result), keys(whole));
  t.ok(
    result.findings.some((f) => f.description === 'codename'),
    'the codename joined across the stop',
  );
});

t.test('a mid-stream stretch that misses its deadline, or whose worker crashes, is a recorded fail-open', async (t) => {
  for (const fault of ['HANG-WORKER', 'CRASH-WORKER']) {
    const registry = createRegistry();
    const engine = new InspectionEngine({
      registry,
      threads: 1,
      timeoutMs: 500,
      streamWorkerUrl: new URL('../fixtures/faulty-stream-worker.ts', import.meta.url),
    });
    t.teardown(() => engine.close());
    const streamed = engine.streamInspection({ policy: splittable, secrets: SECRETS })!;
    const ev = (text: string) =>
      `event: content_block_delta\ndata: ${JSON.stringify({ type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text } })}\n\n`;
    // The fault in the first stretch (a comment line); a leak far after it, in the last stretch.
    const head = `: ${fault}\n\n${ev('zebra-')}${ev('crossing-42 ')}`;
    const filler = `: ${FILLER.repeat(40)}\n\n`.repeat(80);
    const tail = `${ev('then 1234-marker')}event: message_stop\ndata: {"type":"message_stop"}\n\n`;
    const body = Buffer.from(head + filler + filler + tail);
    for (let at = 0; at < body.length; at += 4096) {
      streamed.push(body.subarray(at, at + 4096));
      await new Promise((r) => setTimeout(r, 5));
    }
    const outcome = await streamed.finish();
    const metric = await registry.getSingleMetric('dvx_inspection_stream_checkpoints_total')!.get();
    t.ok(
      metric.values.some((v) => v.labels.kind === 'bytes' && v.value > 0),
      `${fault}: a stretch was scanned during the stream`,
    );
    t.equal(outcome.failOpen, true, `${fault}: a fail-open`);
    const reason = fault === 'HANG-WORKER' ? 'timeout' : 'inspector exploded';
    t.ok(
      outcome.failures.some((f) => f.reason === reason),
      `${fault}: the stretch's inspectors named, ${JSON.stringify(outcome.failures)}`,
    );
    t.ok(
      outcome.findings.some((f) => f.match === '1234****'),
      `${fault}: what the other stretches found still counts`,
    );
    t.ok(
      outcome.findings.some((f) => f.match === 'zebr****'),
      `${fault}: the joined text (its own stretch) still counts`,
    );
    const failopen = await registry.getSingleMetric('dvx_inspection_failopen_total')!.get();
    t.ok(
      failopen.values.some((v) => v.labels.phase === 'response' && v.value > 0),
      `${fault}: counted as a fail-open`,
    );
  }
});

t.test('a long text block is scanned in lines while it is open, and its stop scans only what is left', async (t) => {
  const engine = new InspectionEngine({ registry: createRegistry(), threads: 0 });
  t.teardown(() => engine.close());
  const checkpoint = 8 * 1024;
  // ~200 KB of text in one block, in lines; leaks at a line's start, at its end, split across deltas.
  const lines: string[] = [];
  for (let i = 0; i < 4000; i++) {
    if (i % 500 === 7) lines.push('zebra-crossing-42 opens this line');
    else if (i % 500 === 250) lines.push(`this line ends with ${1000 + i}-marker`);
    else lines.push(`${FILLER}${i}`);
  }
  const text = lines.join('\n');
  const deltas = cutAt(
    text,
    Array.from({ length: 900 }, (_, i) => i * 223 + 5),
  );
  const body = Buffer.from(stream('anthropic', [{ deltas, json: false }]));
  const stopAt = body.indexOf('content_block_stop');
  const plan = compilePlan(splittable);
  const joinedSizes: number[] = [];
  let joinedBeforeStop = 0;
  let pushed = 0;
  const inspection = new StreamInspection(
    plan,
    splittable,
    SECRETS,
    async (task) => {
      if (task.kind === 'joined') {
        joinedSizes.push(task.body.length);
        if (pushed < stopAt) joinedBeforeStop++;
      }
      return scanStretch(plan, { ...task, policy: pooledPolicy(splittable), secrets: SECRETS });
    },
    () => undefined,
    checkpoint,
  );
  for (let at = 0; at < body.length; at += 2048) {
    inspection.push(body.subarray(at, at + 2048));
    pushed = at + 2048;
    await new Promise((r) => setImmediate(r));
  }
  const result = await inspection.finish();
  const whole = await engine.inspect({ body, phase: 'response', policy: splittable, secrets: SECRETS });
  t.strictSame(keys(result), keys(whole), 'the findings of the whole-body scan');
  t.equal(result.findings.filter((f) => f.description === 'marker').length > 0, true, 'line-end markers found');
  t.ok(joinedBeforeStop >= 10, `the block was scanned in lines before its stop (${joinedBeforeStop} cuts)`);
  const largest = Math.max(...joinedSizes);
  t.ok(largest < 2 * checkpoint, `no joined scan read the whole block (largest ${largest} of ${text.length} bytes)`);
  t.equal(
    joinedSizes.reduce((a, b) => a + b, 0) - joinedSizes.length,
    text.length - 1 + 0,
    'each byte of the block was read once (plus the newline before each cut)',
  );
});

t.test('a block cut in lines that grows after its stop is read whole again, its cuts dropped', async (t) => {
  const engine = new InspectionEngine({ registry: createRegistry(), threads: 0 });
  t.teardown(() => engine.close());
  const ev = (data: unknown) => `data: ${JSON.stringify(data)}\n\n`;
  const delta = (index: number, text: string) =>
    ev({ type: 'content_block_delta', index, delta: { type: 'text_delta', text } });
  const many = Array.from({ length: 300 }, (_, i) => delta(0, `${FILLER}${i}\n`)).join('');
  const body = Buffer.from(
    delta(0, 'lead\n') +
      many +
      delta(1, 'other block') +
      ev({ type: 'content_block_stop', index: 0 }) +
      delta(0, 'night') +
      delta(0, 'ingale-123 end\nticket:4321\n'),
  );
  const c = {
    format: 'anthropic' as const,
    blocks: [],
    comments: [],
    chunks: [512],
    checkpoint: 3000,
    policy: splittable,
  };
  const whole = await engine.inspect({ body, phase: 'response', policy: splittable, secrets: SECRETS });
  const { result } = await incremental(c, body);
  t.strictSame(keys(result), keys(whole));
  t.ok(
    result.findings.some((f) => f.description === 'codename') &&
      result.findings.some((f) => f.description === 'ticket'),
    'what arrived after the stop is found',
  );
});
