import { BENCH_PATTERNS, BENCH_SECRETS, llmRequestBody } from './corpus.ts';
import { conditions, UNPINNED } from './conditions.ts';
import { formatMs, mbPerSec, measure, sizeLabel, table } from './measure.ts';
import { normalizedView } from '../pipeline/normalized-view.ts';
import { compilePlan } from '../pipeline/plan.ts';
import { scanBody } from '../pipeline/scan.ts';
import { policyFromDocument } from '../pipeline/policy/resolve.ts';
import { validatePolicyDocument } from '../pipeline/policy/validate.ts';

// Part of `npm run bench -- pipeline`: what the normalized view (pipeline/normalized-view.ts) costs.
// On an ASCII body the prefilter must make it free; on a body with non-ASCII text it is built once;
// its own worst cases must stay linear with a small constant: a 32 MB body of each must leave the view
// well inside the default 2 s deadline (docs/decisions.md, "Padding no longer turns fail-open into a bypass"). They
// are the pads that once timed the view out (`\u200b&`,
// `Ａ&`, `a&#x301;`, `&#8203;x`: each `&` once cut a chunk and cost an NFKC call), entity floods, digit
// runs after `&#`, combining-mark floods on ASCII and on other letters, full-width and 4-byte floods,
// ASCII alternating with non-ASCII, invalid UTF-8, a character NFKC expands 18-fold, and the later
// pads (marks on other letters between expanding characters or invalid bytes, a nested `&amp;`
// after them), and hidden controls. An ASCII body with `&` is the first row: the machine is shared, the ratio is what counts.

const plan = compilePlan(
  policyFromDocument(
    validatePolicyDocument({
      content_inspection: {
        secrets_filter: { enabled: true, severity: 'block' },
        pii_detection: { enabled: true, severity: 'warn' },
        api_key_detection: { enabled: true, severity: 'block' },
        patterns: BENCH_PATTERNS,
      },
    }),
  ),
);

/** The LLM-like body with the non-ASCII text real prompts carry: curly quotes, ellipses, accents, CJK. */
function nonAsciiBody(size: number): Buffer {
  const text = llmRequestBody(size)
    .toString('utf8')
    .replace(/ the /g, ' “the” ')
    .replace(/ value /g, ' valeur… ')
    .replace(/ model /g, ' モデル（model） ')
    .replace(/ time /g, ' ｔｉｍｅ ');
  return Buffer.from(text.slice(0, size * 1.2));
}

function _repeatTo(unit: string, size: number): Buffer {
  const one = Buffer.from(unit);
  return Buffer.from(one.toString().repeat(Math.ceil(size / one.length))).subarray(0, size - (size % one.length));
}

function jsonOf(text: Buffer): Buffer {
  return Buffer.from(
    JSON.stringify({
      model: 'claude-sonnet-4-5',
      max_tokens: 10,
      messages: [{ role: 'user', content: text.toString() }],
    }),
  );
}

const ff = (text: string) => Buffer.concat([Buffer.from(text), Buffer.from([0xff])]);

/** 32 MB worst cases: [name, the unit repeated, raw (not wrapped in JSON: bytes JSON cannot carry), a tail]. */
const WORST: [string, string | Buffer, boolean?, string?][] = [
  ['ASCII text with `&` (the baseline to compare with)', 'lorem ipsum & dolor '],
  ['ZWSP & flood (`\\u200b&`)', '\u200b&'],
  ['full width & (`Ａ&`)', 'Ａ&'],
  ['entity mark (`a&#x301;`)', 'a&#x301;'],
  ['entity ZWSP (`&#8203;x`)', '&#8203;x'],
  ['ZWSP after every byte', 'a\u200b'],
  ['`&#x200b;` flood', '&#x200b;'],
  ['nested `&amp;amp;amp;#64;`', '&amp;amp;amp;#64;'],
  ['`&#` + 1000-digit runs', '&#' + '0'.repeat(1000)],
  ['`&` flood', '&'],
  ['named-entity near misses', '&commatcommatcommatcommatcommatxx'],
  ['marks on ASCII letters', 'a\u0301\u0316\u0301\u0316'],
  ['marks on other letters (`ø` + 2)', 'ø\u0301\u0316'],
  ['marks on CJK (kept)', '日\u0301'],
  ['marks alone', '\u0301\u0316'],
  ['full width', 'ＡＫＩＡ＠ｅｘａｍｐｌｅ．ｃｏｍ　'],
  ['ASCII / accented alternating', 'aé'],
  ['ASCII / marked ø alternating', 'aø\u0301 '],
  ['4-byte math letters', '𝐀'],
  ['4-byte emoji', '😀'],
  ['Hangul conjoining jamo', '\u1100\u1161\u11a8'],
  ['compatibility jamo', 'ㄱㅏ'],
  ['U+FDFA (18× in NFKC)', '\ufdfa'],
  ['invalid UTF-8', Buffer.from(Array.from({ length: 64 }, (_, k) => 0x80 + k)), true],
  // Pads that once cost an NFC call per mark on another letter (every 16 bytes, or at
  // every invalid byte), and a nested `&amp;` after a view twice its input walked twice more.
  ['`α` + U+0316 + `և`×8, then `&amp;amp;amp;`', 'α\u0316' + '\u0587'.repeat(8), false, '&amp;amp;amp;'],
  ['`ᾀ` + U+0316 + `և`×8, then `&amp;amp;amp;`', 'ᾀ\u0316' + '\u0587'.repeat(8), false, '&amp;amp;amp;'],
  ['`α` + U+0301 (composes) + 16 `x`', 'α\u0301' + 'x'.repeat(16)],
  ['`α` + U+0301 + invalid byte', ff('α\u0301'), true],
  ['invalid byte + U+0301 (bytes FF CC 81)', Buffer.from([0xff, 0xcc, 0x81]), true],
  ['`α` + U+0316 + U+0301 + invalid byte', ff('α\u0316\u0301'), true],
  ['`α` + U+0301 ×2 + invalid byte', ff('α\u0301\u0301'), true],
  ['`日` + U+0301 + U+0316 (reordered) + invalid byte', ff('日\u0301\u0316'), true],
  ['Thai with marks + invalid byte', ff('ก\u0e34\u0e48'), true],
  ['`և` (view twice the input)', '\u0587'],
  // Hidden controls (hidden-controls.ts), raw: JSON would escape them. One at the end sends the whole
  // body of text lines through the walk that also stops at controls (line breaks in most words).
  ['NUL after every letter (`a\\0`), raw', 'a\u0000', true],
  ['text lines, one NUL at the end, raw', 'lorem ipsum dolor sit amet\n', true, '\u0000'],
  // Backspaces, as JSON escapes them (`\b`): hidden controls, dropped after decoding.
  ['backspace after every letter (`a\\b`)', 'a\b'],
  ['`α` + U+0316 + U+0301 + backspace (a batch each)', 'α\u0316\u0301\b'],
];

export async function normalizedViewTable(quick: boolean): Promise<string> {
  const budget = quick ? 300 : 1500;
  const MB = 1024 * 1024;
  const bodies: [string, Buffer][] = [
    ['4 KB ASCII (the hot path)', llmRequestBody(4 * 1024)],
    ['1 MB ASCII', llmRequestBody(MB)],
    ['1 MB with non-ASCII text', nonAsciiBody(MB)],
  ];
  const rows: string[][] = [];
  for (const [name, body] of bodies) {
    const b = body.length >= MB ? budget : budget / 2;
    const view = await measure(() => normalizedView(body), { budgetMs: b });
    const full = await measure(() => scanBody(plan, { body, phase: 'request', secrets: BENCH_SECRETS }), {
      budgetMs: b,
    });
    const built = normalizedView(body);
    rows.push([
      name,
      sizeLabel(body.length),
      built === null ? 'none' : sizeLabel(built.bytes.length),
      mbPerSec(body.length, view.p50).toFixed(0),
      formatMs(view.p50),
      mbPerSec(body.length, full.p50).toFixed(0),
      formatMs(full.p50),
      formatMs(full.p99),
    ]);
  }
  const worst: string[][] = [];
  const SIZE = 32 * MB;
  for (const [name, unit, raw, tail] of WORST) {
    const one = Buffer.isBuffer(unit) ? unit : Buffer.from(unit);
    const end = Buffer.from(tail ?? '');
    const fill = SIZE - end.length;
    const text = Buffer.concat([Buffer.alloc(fill - (fill % one.length), one), end]);
    const body = raw ? text : jsonOf(text);
    const runs = { warmup: 1, minRuns: quick ? 2 : 5, maxRuns: quick ? 2 : 5 };
    const view = await measure(() => normalizedView(body), runs);
    const full = await measure(() => scanBody(plan, { body, phase: 'request', secrets: BENCH_SECRETS }), {
      ...runs,
      minRuns: quick ? 1 : 3,
      maxRuns: quick ? 1 : 3,
    });
    const built = normalizedView(body);
    worst.push([
      name,
      sizeLabel(body.length),
      built === null ? 'none' : sizeLabel(built.bytes.length),
      mbPerSec(body.length, view.p50).toFixed(0),
      formatMs(view.p50),
      formatMs(full.p50),
    ]);
  }
  return [
    `### normalized view — ${conditions('request phase; full set = secrets (3) + PII + API keys + 10 RE2 patterns, inline', UNPINNED)}`,
    '',
    table(
      ['body', 'size', 'view', 'view alone MB/s', 'view p50', 'full set MB/s', 'full set p50', 'full set p99'],
      rows,
    ),
    '',
    '#### its worst cases at 32 MB (each unit repeated, inside a JSON request; invalid UTF-8 raw; compare with the ASCII row of the same run)',
    '',
    table(['body', 'size', 'view', 'view alone MB/s', 'view p50', 'full set p50'], worst),
    '',
  ].join('\n');
}
