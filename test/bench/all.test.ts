import { test } from 'tap';
import { spawnSync } from 'node:child_process';
import { readFile } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';
import { regenerate } from '../../bench/all.ts';
import { sessionBodies } from '../../bench/session.ts';
import { extractSummary } from '../../bench/summary.ts';

// The benchmark runner's bookkeeping, not speed: what `bench -- all` makes of a bench's printed tables,
// what it keeps of bench/RESULTS.md when it regenerates it, and that a session resends its past.

const ROOT = fileURLToPath(new URL('../../', import.meta.url));

test('the summary reads ratios from the tables in bench/RESULTS.md by column name', async (t) => {
  const results = await readFile(`${ROOT}bench/RESULTS.md`, 'utf8');
  const section = (name: string) =>
    results
      .split(/^(?=## )/m)
      .filter((s) => s.startsWith(`## ${name} (`))
      .join('');
  const proxy = extractSummary('proxy', section('proxy'));
  const vsFloor = proxy.find(
    (r) => r.measure.startsWith('4 KB at 500 req/s, --workers 1') && r.measure.endsWith('p50 added vs the floor'),
  );
  t.ok(vsFloor, 'a 4 KB row against the floor');
  // The ratio is the table's own `p50 added / floor` cell for that row.
  const row = section('proxy')
    .split('\n')
    .find((l) => l.startsWith('| dvx: full') && l.includes('--workers 1') && /\| 4 KB +\| 500 +\|/.test(l));
  const cells = row?.split('|').map((c) => c.trim()) ?? [];
  t.ok(cells.includes(vsFloor?.ours ?? ''), 'ours is the row’s p50 added');
  t.ok(cells.includes(`${vsFloor?.ratio?.toFixed(2)}×`), 'the ratio is the row’s p50 added / floor');
  t.ok(
    proxy.some((r) => r.measure.includes('Portkey')),
    'and against Portkey with its guardrail',
  );
  const broker = extractSummary('broker', section('broker'));
  const call = broker.find((r) => r.measure.startsWith('ours: llmproxy call'));
  t.match(call?.measure, /vs baseline: the call straight to the upstream/, 'a baseline row just above wins');
  const renamed = extractSummary('wal', '| who | speed |\n|-----|-------|\n| ours | 1 |\n');
  t.match(renamed[0].measure, /no table with/, 'a table it cannot find is said, not guessed');
  t.equal(renamed[0].ratio, null);
});

test('regenerating RESULTS.md keeps the intro and the sections of benches that did not run', (t) => {
  const old = [
    '# Benchmark results',
    '',
    'Intro that stays.',
    '',
    '## pipeline (`npm run bench -- pipeline`)',
    '',
    'old pipeline table',
    '',
    '## pipeline, worst cases (part of it)',
    '',
    'old worst cases',
    '',
    '## wal (`npm run bench -- wal`)',
    '',
    'old wal table',
    '',
    '### Reading it',
    '',
    'old prose',
    '',
  ].join('\n');
  const out = regenerate(
    old,
    [{ bench: 'wal', markdown: '## wal — conditions\n\n| a |\n|---|\n| 1 |\n', summary: [], seconds: 1, failed: null }],
    '## summary (`npm run bench -- all`)\n\nthe summary\n',
  );
  t.ok(out.startsWith('# Benchmark results\n\nIntro that stays.\n'), 'intro kept');
  t.match(out, 'old pipeline table');
  t.match(out, 'old worst cases');
  t.notMatch(out, 'old wal table', 'the bench that ran replaces its section');
  t.notMatch(out, 'old prose', '… and the reading of its old numbers');
  t.match(out, '## wal (`npm run bench -- wal`)\n\n### wal — conditions', 'under its old heading, one level down');
  t.ok(out.trimEnd().endsWith('the summary'), 'the summary last');
  t.end();
});

test('a generated session resends every earlier turn and grows to about 300 KB at turn 40', (t) => {
  const bodies = sessionBodies(40, 7);
  t.equal(bodies.length, 40);
  for (let i = 1; i < bodies.length; i++) {
    const before = JSON.parse(bodies[i - 1].toString()).messages;
    const now = JSON.parse(bodies[i].toString()).messages;
    t.same(now.slice(0, before.length), before, `turn ${i + 1} starts with turn ${i}`);
  }
  t.ok(bodies[39].length > 250 * 1024 && bodies[39].length < 350 * 1024, `${bodies[39].length} bytes at turn 40`);
  t.match(bodies[11].toString(), /sk-ant-api03-/, 'the API key is there from turn 12');
  t.end();
});

test('bench -- all names the bench it does not know', (t) => {
  const r = spawnSync(process.execPath, [`${ROOT}bench/run.ts`, 'all', '--only', 'nope'], { encoding: 'utf8' });
  t.equal(r.status, 2);
  t.match(r.stderr, /no bench named nope/);
  t.end();
});
