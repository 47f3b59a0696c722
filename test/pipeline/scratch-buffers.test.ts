import fc from 'fast-check';
import t from 'tap';
import { BENCH_SECRETS, FULL_SET_DOCUMENT, llmRequestBody } from '../../bench/corpus.ts';
import { decodedViews } from '../../pipeline/json-view.ts';
import { compilePlan } from '../../pipeline/plan.ts';
import { policyFromDocument } from '../../pipeline/policy/resolve.ts';
import { validatePolicyDocument } from '../../pipeline/policy/validate.ts';
import { type ScanResult, scanBody } from '../../pipeline/scan.ts';
import { ScratchBuffers, scratchHeld } from '../../pipeline/scratch-buffers.ts';

// A scan's decoded view is written into a buffer lent for that scan only (scratch-buffers.ts) and
// written over by the next scan. What one scan finds must not depend on what the scans before it read:
// the same body scanned after any other gives the same result as scanned first.

const plan = compilePlan(policyFromDocument(validatePolicyDocument(FULL_SET_DOCUMENT)));
const scan = (body: Buffer): ScanResult => scanBody(plan, { body, phase: 'request', secrets: BENCH_SECRETS });
const key = (r: ScanResult) =>
  JSON.stringify({
    findings: r.findings.map((f) => `${f.inspector_type} ${f.severity} ${f.description} ${f.match}`).sort(),
    failures: r.failures,
  });

/**
 * A JSON body whose escapes decode to `text`, padded with escaped filler to about `size` bytes; an odd
 * size puts it in a tool result's JSON inside the message (two levels of escapes: two buffers lent).
 */
function body(text: string, size: number): Buffer {
  const filler = 'line of tool output\nwith "quotes" and a tab\there; ';
  let content = '';
  while (content.length < size) content += filler;
  content += text;
  if (size % 2 === 1) content = JSON.stringify({ tool_result: content });
  return Buffer.from(JSON.stringify({ model: 'claude-3-5-sonnet', messages: [{ role: 'user', content }] }));
}

t.test('a scan gives its decoded view back, and the next scan writes over the same buffer', async (t) => {
  const first = scan(body('nothing here', 300_000));
  t.same(first.findings, []);
  const held = scratchHeld();
  t.ok(held.buffers >= 1, `the buffer is kept (${held.buffers}, ${held.bytes} bytes)`);
  scan(body('also nothing', 300_000)); // the same length: the kept buffer fits
  t.same(scratchHeld(), held, 'and taken again, not another one made');
});

t.test('what a scan finds does not depend on the scans before it', async (t) => {
  const leaks = [
    'my key is AKIAIOSFODNN7EXAMPLE',
    'the db password: s3cr3t-db-password-2026',
    'mail bob@example.com about Project Nightingale',
    'card 4111 1111 1111 1111',
    'nothing to see',
    'INC-123456 on db.corp.example.com',
  ];
  const sizes = [100, 20_000, 70_001, 300_000, 300_001, 1_100_000];
  // Each body's result scanned first in a fresh order, then after every other body.
  const alone = new Map<string, string>();
  for (const leak of leaks) for (const size of sizes) alone.set(`${leak}|${size}`, key(scan(body(leak, size))));
  fc.assert(
    fc.property(
      fc.array(fc.tuple(fc.constantFrom(...leaks), fc.constantFrom(...sizes)), { minLength: 2, maxLength: 6 }),
      (sequence) => {
        for (const [leak, size] of sequence) {
          const got = key(scan(body(leak, size)));
          if (got !== alone.get(`${leak}|${size}`))
            throw new Error(`${leak} at ${size} after ${JSON.stringify(sequence)}`);
        }
      },
    ),
    { numRuns: 60 },
  );
  t.ok([...alone.values()].filter((v) => v.includes('block')).length >= 10, 'the leaks are found');
});

t.test('the corpus body through the scratch buffers and through buffers of its own: the same findings', async (t) => {
  const corpus = llmRequestBody(1 << 20);
  const before = key(scan(corpus));
  scan(body('x', 1_500_000));
  t.equal(key(scan(corpus)), before);
  // The views themselves: decoded into a lent buffer, then into a new one.
  const lender = new ScratchBuffers();
  for (const b of [corpus, body('two levels', 200_001), body('one level', 200_000), corpus]) {
    const lent = decodedViews(b, true, (n) => lender.take(n));
    const own = decodedViews(b, true);
    t.ok(lent.decoded.equals(own.decoded) && lent.literal.equals(own.literal));
  }
  lender.end();
});

t.test('what is kept is bounded: 16 MB a buffer, 32 MB and eight buffers in all', async (t) => {
  const lender = new ScratchBuffers();
  const taken = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10].map((k) => lender.take(k * 1024 * 1024));
  t.ok(taken.every((b, k) => b.length >= (k + 1) * 1024 * 1024));
  const huge = lender.take(20 * 1024 * 1024);
  t.ok(huge.length >= 20 * 1024 * 1024);
  lender.end();
  const held = scratchHeld();
  t.ok(held.bytes <= 32 * 1024 * 1024, `${held.bytes} bytes`);
  t.ok(held.buffers <= 8, `${held.buffers} buffers`);
  // A body needing more than any kept buffer gets a new one.
  const again = new ScratchBuffers();
  t.ok(again.take(17 * 1024 * 1024).length >= 17 * 1024 * 1024);
  // Two loans at once (nested levels) are two buffers.
  const a = again.take(1000);
  const b = again.take(1000);
  t.not(a.buffer === b.buffer && a.byteOffset === b.byteOffset, true);
  again.end();
});
