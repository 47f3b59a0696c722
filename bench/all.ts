import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { cpus, loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { fileURLToPath } from 'node:url';
import { machineConditions } from './conditions.ts';
import { table } from './measure.ts';
import { extractSummary, SUMMARY_FILE_ENV, summaryTable, type SummaryRow } from './summary.ts';

// npm run bench -- all [--quick] [--only a,b] [--write | --out FILE] [options passed to every bench]
// Every benchmark, one after the other, each in its own process (a bench pins itself to a core and
// warms its JIT: neither may leak into the next), then a summary table of the ratios that matter and
// the machine's conditions. --write regenerates bench/RESULTS.md from the run: its intro is kept, each
// bench that ran replaces its sections (those whose heading starts with its name), a bench that did not
// run keeps its old ones, and the summary goes at the end. Without --write or --out it only prints.

export const ALL_BENCHES = ['pipeline', 'proxy', 'wal', 'controlplane', 'audit-query', 'broker', 'gateway', 'session'];

/**
 * What --quick means to a bench that has no --quick of its own (its options read the first occurrence,
 * so options given on the command line come first and win).
 */
const QUICK_ARGS: Record<string, string[]> = {
  'audit-query': ['--rows', '1000000', '--pg-rows', '100000', '--runs', '10'],
  broker: ['--seconds', '2'],
  controlplane: ['--seconds', '2'],
};

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const RESULTS = join(ROOT, 'bench/RESULTS.md');

interface Ran {
  bench: string;
  markdown: string;
  summary: SummaryRow[];
  seconds: number;
  failed: string | null;
  /** The 1-minute load average when the bench started and when it ended (absent in older callers). */
  load?: { start: number; end: number };
}

/** Per bench: how long it took and the load average around it (the machine is shared: read it first). */
export function loadTable(ran: Ran[]): string {
  return table(
    ['bench', 'time', 'load average (1 min) at its start', 'at its end'],
    ran.map((r) => [
      r.bench,
      `${r.seconds.toFixed(0)} s`,
      r.load ? r.load.start.toFixed(2) : '',
      r.load ? r.load.end.toFixed(2) : '',
    ]),
  );
}

function runOne(bench: string, args: string[], summaryFile: string): Promise<{ out: string; code: number | null }> {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [join(ROOT, 'bench/run.ts'), bench, ...args], {
      env: { ...process.env, [SUMMARY_FILE_ENV]: summaryFile },
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    let out = '';
    child.stdout.on('data', (c: Buffer) => {
      out += c;
      process.stdout.write(c);
    });
    child.on('exit', (code, signal) => resolve({ out, code: code ?? (signal ? 128 : null) }));
  });
}

/** A bench's own headings sit one level under its section's. */
function demote(markdown: string): string {
  return markdown
    .trim()
    .split('\n')
    .map((l) => (/^#{1,5} /.test(l) ? `#${l}` : l))
    .join('\n');
}

/** The bench a RESULTS.md section belongs to: the first word of its `## ` heading. */
function benchOf(heading: string): string {
  return /^## ([\w-]+)/.exec(heading)?.[1] ?? '';
}

/** RESULTS.md regenerated from this run (see the header comment for what is kept). */
export function regenerate(old: string, ran: Ran[], summary: string): string {
  const parts = old.split(/^(?=## )/m);
  const intro = parts[0].startsWith('## ') ? '# Benchmark results\n\n' : parts[0];
  const sections = parts.slice(parts[0].startsWith('## ') ? 0 : 1);
  const oldOf = (bench: string) => sections.filter((s) => benchOf(s) === bench);
  const ranNames = new Set(ran.map((r) => r.bench));
  const known = new Set([...ALL_BENCHES, 'summary']);
  const out: string[] = [intro.trimEnd(), ''];
  for (const bench of ALL_BENCHES) {
    const r = ran.find((x) => x.bench === bench);
    if (!r) {
      for (const s of oldOf(bench)) out.push(s.trimEnd(), '');
      continue;
    }
    const heading =
      oldOf(bench)
        .map((s) => s.split('\n')[0])
        .find((h) => h.startsWith(`## ${bench} (`)) ?? `## ${bench} (\`npm run bench -- ${bench}\`)`;
    out.push(heading, '', r.failed ? `(this run failed: ${r.failed})` : demote(r.markdown), '');
  }
  // Sections of no known bench (none today) are kept as they were.
  for (const s of sections) if (!known.has(benchOf(s)) && !ranNames.has(benchOf(s))) out.push(s.trimEnd(), '');
  out.push(summary.trimEnd(), '');
  return out.join('\n');
}

export async function main(args: string[]): Promise<void> {
  const value = (flag: string) => {
    const i = args.indexOf(flag);
    return i >= 0 ? args[i + 1] : undefined;
  };
  const only = value('--only')?.split(',').filter(Boolean);
  const unknown = only?.filter((b) => !ALL_BENCHES.includes(b)) ?? [];
  if (unknown.length) {
    process.stderr.write(`bench all: no bench named ${unknown.join(', ')} (have ${ALL_BENCHES.join(', ')})\n`);
    process.exitCode = 2;
    return;
  }
  const outFile = args.includes('--write') ? RESULTS : value('--out');
  // What is the runner's own stays here; everything else (--quick, a bench's options) goes to each bench.
  const passed = args.filter(
    (a, i) => !['--write', '--only', '--out'].includes(a) && !['--only', '--out'].includes(args[i - 1]),
  );
  const benches = only ?? ALL_BENCHES;
  const loadBefore = loadavg();
  const started = new Date().toISOString();
  const dir = await mkdtemp(join(tmpdir(), 'dvx-bench-all-'));
  const ran: Ran[] = [];
  try {
    for (const bench of benches) {
      const file = join(dir, `${bench}.json`);
      const t0 = performance.now();
      const loadStart = loadavg()[0];
      const benchArgs = [...passed, ...(passed.includes('--quick') ? (QUICK_ARGS[bench] ?? []) : [])];
      process.stderr.write(`\n== bench ${bench} ${benchArgs.join(' ')}\n`);
      const { out, code } = await runOne(bench, benchArgs, file);
      const seconds = (performance.now() - t0) / 1000;
      const failed = code === 0 ? null : `exit code ${code}`;
      // A returned summary is the bench's word; otherwise its tables are read by column name.
      const summary: SummaryRow[] = existsSync(file)
        ? JSON.parse(await readFile(file, 'utf8'))
        : extractSummary(bench, out);
      if (failed) summary.unshift({ bench, measure: `(failed: ${failed})`, ours: '', baseline: '', ratio: null });
      ran.push({ bench, markdown: out, summary, seconds, failed, load: { start: loadStart, end: loadavg()[0] } });
    }
  } finally {
    await rm(dir, { recursive: true, force: true });
  }

  const summary = [
    '## summary (`npm run bench -- all`)',
    '',
    `Ratios are ours / the baseline (the floor or a peer) from this run; for times lower is better, for rates and throughput the measure says "higher is better". Started ${started.replace(/\.\d+Z$/, 'Z')}; run with \`npm run bench -- all${passed.length ? ` ${passed.join(' ')}` : ''}\`${only ? ` (only ${only.join(', ')})` : ''}.`,
    '',
    summaryTable(ran.flatMap((r) => r.summary)),
    '',
    `Machine: ${machineConditions(loadBefore)}. With ${cpus().length} cores, a load average above ${cpus().length} means the benches shared the cores with other work: weigh those rows' ratios (each bench interleaves or runs its contenders back to back in one run) and not their times.`,
    '',
    loadTable(ran),
    '',
  ].join('\n');
  process.stdout.write(`\n${summary}`);

  if (outFile) {
    const old = await readFile(RESULTS, 'utf8').catch(() => '');
    await writeFile(outFile, regenerate(old, ran, summary));
    process.stderr.write(`bench all: wrote ${outFile}\n`);
  }
  if (ran.some((r) => r.failed)) process.exitCode = 1;
}
