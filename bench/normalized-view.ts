import { BENCH_PATTERNS, BENCH_SECRETS, llmRequestBody } from './corpus.ts';
import { conditions, formatMs, mbPerSec, measure, sizeLabel, table } from './measure.ts';
import { normalizedView } from '../pipeline/normalized-view.ts';
import { compilePlan } from '../pipeline/plan.ts';
import { scanBody } from '../pipeline/scan.ts';
import { policyFromDocument } from '../pipeline/policy/resolve.ts';
import { validatePolicyDocument } from '../pipeline/policy/validate.ts';

// Part of `npm run bench -- pipeline`: what the normalized view (pipeline/normalized-view.ts) costs.
// On an ASCII body the prefilter must make it free; on a body with non-ASCII text it is built once;
// its own worst cases (an `&` flood, `&#` with a long digit run, combining marks NFKC reorders,
// full-width text, a ZWSP after every character, a character NFKC expands 18-fold) must stay linear.

const plan = compilePlan(policyFromDocument(validatePolicyDocument({
  content_inspection: {
    secrets_filter: { enabled: true, severity: 'block' },
    pii_detection: { enabled: true, severity: 'warn' },
    api_key_detection: { enabled: true, severity: 'block' },
    patterns: BENCH_PATTERNS,
  },
})));

/** The LLM-like body with the non-ASCII text real prompts carry: curly quotes, ellipses, accents, CJK. */
function nonAsciiBody(size: number): Buffer {
  const text = llmRequestBody(size).toString('utf8')
    .replace(/ the /g, ' “the” ')
    .replace(/ value /g, ' valeur… ')
    .replace(/ model /g, ' モデル（model） ')
    .replace(/ time /g, ' ｔｉｍｅ ');
  return Buffer.from(text.slice(0, size * 1.2));
}

function repeatTo(unit: string, size: number): Buffer {
  const one = Buffer.from(unit);
  return Buffer.from(one.toString().repeat(Math.ceil(size / one.length))).subarray(0, size - (size % one.length));
}

function jsonOf(text: Buffer): Buffer {
  return Buffer.from(JSON.stringify({ model: 'claude-sonnet-4-5', max_tokens: 10, messages: [{ role: 'user', content: text.toString() }] }));
}

export async function normalizedViewTable(quick: boolean): Promise<string> {
  const budget = quick ? 300 : 1500;
  const MB = 1024 * 1024;
  const bodies: [string, Buffer][] = [
    ['4 KB ASCII (the hot path)', llmRequestBody(4 * 1024)],
    ['1 MB ASCII', llmRequestBody(MB)],
    ['1 MB with non-ASCII text', nonAsciiBody(MB)],
    ['1 MB worst: & flood', jsonOf(repeatTo('&', MB))],
    ['1 MB worst: &# + digit runs', jsonOf(repeatTo('&#' + '0'.repeat(1000), MB))],
    ['1 MB worst: named-entity near misses', jsonOf(repeatTo('&commatcommatcommatcommatcommatxx', MB))],
    ['1 MB worst: combining marks on letters', jsonOf(repeatTo('a\u0301\u0316\u0301\u0316\u0301\u0316', MB))],
    ['1 MB worst: alternating marks only', jsonOf(repeatTo('\u0301\u0316', MB))],
    ['1 MB worst: full width', jsonOf(repeatTo('ＡＫＩＡ＠ｅｘａｍｐｌｅ．ｃｏｍ　', MB))],
    ['1 MB worst: ZWSP after every byte', jsonOf(repeatTo('a\u200b', MB))],
    ['1 MB worst: U+FDFA (18× in NFKC)', jsonOf(repeatTo('\ufdfa', MB))],
  ];
  const rows: string[][] = [];
  for (const [name, body] of bodies) {
    const b = body.length >= MB ? budget : budget / 2;
    const view = await measure(() => normalizedView(body), { budgetMs: b });
    const full = await measure(() => scanBody(plan, { body, phase: 'request', secrets: BENCH_SECRETS }), { budgetMs: b });
    const built = normalizedView(body);
    rows.push([name, sizeLabel(body.length), built === null ? 'none' : sizeLabel(built.bytes.length),
      mbPerSec(body.length, view.p50).toFixed(0), formatMs(view.p50), mbPerSec(body.length, full.p50).toFixed(0), formatMs(full.p50), formatMs(full.p99)]);
  }
  return [
    `### normalized view — ${conditions('request phase; full set = secrets (3) + PII + API keys + 10 RE2 patterns, inline')}`,
    '',
    table(['body', 'size', 'view', 'view alone MB/s', 'view p50', 'full set MB/s', 'full set p50', 'full set p99'], rows),
    '',
  ].join('\n');
}
