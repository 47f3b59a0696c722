import fc from 'fast-check';
import t from 'tap';
import { BENCH_SECRETS, FULL_SET_DOCUMENT } from '../../bench/corpus.ts';
import { compilePlan } from '../../pipeline/plan.ts';
import { policyFromDocument } from '../../pipeline/policy/resolve.ts';
import { validatePolicyDocument } from '../../pipeline/policy/validate.ts';
import { type ScanResult, scanBody } from '../../pipeline/scan.ts';
import { decodeEscapes } from '../../pipeline/json-escapes.ts';
import { holdsHiddenControl } from '../../pipeline/hidden-controls.ts';
import { findNeedle, needleSearch } from '../../pipeline/literal-search.ts';
import { alignedCopy, copyBytes, copyIntoSpare, isShared, SCAN_COPY_UP_TO_BYTES } from '../../pipeline/shared-bytes.ts';

// Copies into and out of shared memory (shared-bytes.ts): copyBytes is Buffer.copy, byte for byte,
// whatever the two ends (their own memory or shared, aligned alike or not, one buffer overlapping
// itself), and a body in shared memory is scanned exactly as the same bytes in memory of its own.

/** `length` bytes at `offset` of a fresh buffer (shared or not), filled from `seed`. */
function bytes(length: number, offset: number, shared: boolean, seed: number): Buffer {
  const backing = shared ? new SharedArrayBuffer(length + offset) : new ArrayBuffer(length + offset);
  const out = Buffer.from(backing, offset, length);
  for (let i = 0; i < length; i++) out[i] = (i * 31 + seed * 7 + (i >> 9)) & 0xff;
  return out;
}

t.test('copyBytes copies what Buffer.copy copies, between any two buffers', async (t) => {
  // Lengths around the bounce's thresholds (256 bytes, steps of 64 KB) and offsets at every alignment.
  const length = fc.oneof(
    fc.integer({ min: 0, max: 300 }),
    fc.integer({ min: 60_000, max: 200_000 }),
    fc.constantFrom(255, 256, 257, 65_536, 65_537, 131_072),
  );
  t.doesNotThrow(() =>
    fc.assert(
      fc.property(
        length,
        fc.boolean(),
        fc.boolean(),
        fc.integer({ min: 0, max: 15 }),
        fc.integer({ min: 0, max: 15 }),
        fc.integer({ min: 0, max: 40 }),
        fc.integer({ min: 0, max: 40 }),
        fc.integer(),
        (n, sourceShared, targetShared, sourceOffset, targetOffset, sourceStart, targetStart, seed) => {
          const source = bytes(n + sourceStart + 3, sourceOffset, sourceShared, seed);
          const target = bytes(n + targetStart + 5, targetOffset, targetShared, seed + 1);
          const expected = Buffer.from(target);
          const copied = Buffer.from(source).copy(expected, targetStart, sourceStart, sourceStart + n);
          const got = copyBytes(source, target, targetStart, sourceStart, sourceStart + n);
          return got === copied && target.equals(expected);
        },
      ),
      { numRuns: 400 },
    ),
  );
});

t.test('copyBytes moves bytes within one shared buffer as copyWithin does, overlapping either way', async (t) => {
  t.doesNotThrow(() =>
    fc.assert(
      fc.property(
        fc.integer({ min: 0, max: 200_000 }),
        fc.integer({ min: 0, max: 15 }),
        fc.integer({ min: -70_000, max: 70_000 }),
        fc.integer(),
        (n, offset, shift, seed) => {
          const size = n + Math.abs(shift) + 16;
          const buffer = bytes(size, offset, true, seed);
          const expected = Buffer.from(buffer);
          const from = shift < 0 ? -shift : 0;
          const to = from + shift;
          expected.copyWithin(to, from, from + n);
          copyBytes(buffer, buffer, to, from, from + n);
          return buffer.equals(expected);
        },
      ),
      { numRuns: 300 },
    ),
  );
  // The prefix's splice: the tail moved right by a few hundred bytes, past several steps.
  const buffer = bytes(400_000, 3, true, 9);
  const expected = Buffer.from(buffer);
  expected.copyWithin(1_003, 200, 350_000);
  copyBytes(buffer, buffer, 1_003, 200, 350_000);
  t.ok(buffer.equals(expected), 'a tail moved right by 803 bytes');
});

t.test('copyBytes refuses a range outside either buffer, and copies nothing for an empty one', async (t) => {
  const source = bytes(1_000, 0, true, 1);
  const target = bytes(1_000, 0, false, 2);
  const before = Buffer.from(target);
  t.throws(() => copyBytes(source, target, 500, 0, 600), RangeError);
  t.throws(() => copyBytes(source, target, 0, 900, 1_100), RangeError);
  t.throws(() => copyBytes(source, target, -1, 0, 10), RangeError);
  t.equal(copyBytes(source, target, 0, 10, 10), 0);
  t.ok(target.equals(before), 'the target is left as it was');
});

t.test('copyIntoSpare copies what set copies, and leaves the target alone past the spare bytes', async (t) => {
  t.doesNotThrow(() =>
    fc.assert(
      fc.property(
        fc.integer({ min: 0, max: 70_000 }),
        fc.boolean(),
        fc.integer({ min: 0, max: 15 }),
        fc.integer({ min: 0, max: 40 }),
        fc.integer({ min: 0, max: 40 }),
        fc.integer(),
        (n, shared, offset, from, at, seed) => {
          const source = bytes(n + from + 9, offset, shared, seed);
          const target = bytes(at + n + 7 + 32, 0, false, seed + 1);
          const expected = Buffer.from(target);
          expected.set(source.subarray(from, from + n), at);
          copyIntoSpare(target, at, source, from, from + n);
          // Only [at, at + n) is promised; the 7 bytes past it may be written over, nothing further.
          return (
            target.subarray(0, at + n).equals(expected.subarray(0, at + n)) &&
            target.subarray(at + n + 7).equals(expected.subarray(at + n + 7))
          );
        },
      ),
      { numRuns: 300 },
    ),
  );
});

t.test('the WebAssembly scans read a shared input at every alignment as they read one of their own', async (t) => {
  const text =
    'line one\\nwith \\"quotes\\" and \\u00e9 \\t tab; Project Nightingale; bob@example.com; ' +
    'AKIAIOSFODNN7EXAMPLE; ';
  let plain = '';
  while (plain.length < 150_000) plain += text;
  // One hidden control, in the third of the module's 64 KB chunks.
  const own = Buffer.from(`${plain}\u0001 the end`);
  const needle = { bytes: Buffer.from('nightingale'), fold: true, pivots: [0, 5] as [number, number] };
  for (let offset = 0; offset < 8; offset++) {
    const shared = Buffer.from(new SharedArrayBuffer(own.length + offset), offset, own.length);
    own.copy(shared);
    for (const from of [0, 3, 9]) {
      t.same(
        decodeEscapes(shared, from)?.bytes,
        decodeEscapes(own, from)?.bytes,
        `decoded escapes, offset ${offset}, from ${from}`,
      );
    }
    if (needleSearch === 'simd')
      t.same(
        findNeedle(shared, needle, 1e6, 1e7),
        findNeedle(own, needle, 1e6, 1e7),
        `literal starts, offset ${offset}`,
      );
    t.equal(holdsHiddenControl(shared), true, `the hidden control is found, offset ${offset}`);
    t.equal(holdsHiddenControl(shared.subarray(0, plain.length)), false, 'and none in the text before it');
  }
});

t.test('a shared body past the size a scan copies is scanned where it lies, as a copy of its own', async (t) => {
  const plan = compilePlan(policyFromDocument(validatePolicyDocument(FULL_SET_DOCUMENT)));
  const scan = (body: Buffer) =>
    scanBody(plan, { body, phase: 'request', secrets: BENCH_SECRETS })
      .findings.map((f) => `${f.inspector_type} ${f.match}`)
      .sort();
  const filler = 'tool output line\\n\\t\\"quoted\\" and more words here; ';
  let content = '';
  while (content.length < SCAN_COPY_UP_TO_BYTES + 100_000) content += filler;
  content += 'AKIAIOSFODNN7EXAMPLE and Project Nightingale and bob@example.com';
  const own = Buffer.from(`{"model":"claude-3-5-sonnet","messages":[{"role":"user","content":"${content}"}]}`);
  const shared = Buffer.from(new SharedArrayBuffer(own.length + 5), 5, own.length);
  own.copy(shared);
  const expected = scan(own);
  t.ok(expected.length >= 3, `the leaks are found (${expected.join(', ')})`);
  t.same(scan(shared), expected);
});

t.test('alignedCopy copies into memory of its own at the source alignment', async (t) => {
  for (let offset = 0; offset < 16; offset++) {
    const source = bytes(5_000, offset, true, offset);
    const copy = alignedCopy(source, (n) => Buffer.allocUnsafeSlow(n));
    t.ok(copy.equals(source), `offset ${offset}: the same bytes`);
    t.notOk(isShared(copy), 'in memory of its own');
    t.equal(copy.byteOffset & 7, offset & 7, 'at the same address modulo 8');
  }
});

t.test('a body in shared memory is scanned as the same bytes in memory of its own', async (t) => {
  const plan = compilePlan(policyFromDocument(validatePolicyDocument(FULL_SET_DOCUMENT)));
  const key = (r: ScanResult) =>
    JSON.stringify({
      findings: r.findings.map((f) => `${f.inspector_type} ${f.severity} ${f.description} ${f.match}`).sort(),
      failures: r.failures,
    });
  const scan = (body: Buffer) => key(scanBody(plan, { body, phase: 'request', secrets: BENCH_SECRETS }));
  const leaks = [
    'my key is AKIAIOSFODNN7EXAMPLE',
    'AKIA\\u200bIOSFODNN7EXAMPLE split by an escaped zero-width space',
    'the db password: s3cr3t-db-password-2026',
    'mail bob@example.com about Project Nightingale\\n',
    'wait… Project Nightingale',
    'card 4111 1111 1111 1111',
    'nothing to see',
  ];
  let found = 0;
  fc.assert(
    fc.property(
      fc.constantFrom(...leaks),
      fc.integer({ min: 0, max: 40_000 }),
      fc.integer({ min: 0, max: 15 }),
      (leak, pad, offset) => {
        const text = `${'tool output\\n\\t"quoted" '.repeat(pad / 24)}${leak}`;
        const plain = Buffer.from(`{"model":"claude-3-5-sonnet","messages":[{"role":"user","content":"${text}"}]}`);
        const shared = Buffer.from(new SharedArrayBuffer(plain.length + offset), offset, plain.length);
        plain.copy(shared);
        const expected = scan(plain);
        if (expected.includes('"findings":["')) found++;
        return scan(shared) === expected;
      },
    ),
    { numRuns: 200 },
  );
  t.ok(found > 100, `most bodies carry a finding (${found} of 200)`);
});
