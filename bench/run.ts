import { writeFileSync } from 'node:fs';
import { SUMMARY_FILE_ENV, type BenchResult } from './summary.ts';

// npm run bench -- <name>: each benchmark prints one table (ours, a baseline and peers, in one run).
// `npm run bench -- all` runs every one of them, each in its own process, and ends with a summary.
// A bench's main() may return its summary rows; asked by `all` (SUMMARY_FILE_ENV), they go to a file.
// biome-ignore lint/suspicious/noConfusingVoidType: a bench that returns no summary is a Promise<void>
type Main = (args: string[]) => Promise<BenchResult | undefined | void>;
const BENCHES: Record<string, () => Promise<{ main: Main }>> = {
  pipeline: () => import('./pipeline.ts'),
  proxy: () => import('./proxy.ts'),
  wal: () => import('./wal.ts'),
  controlplane: () => import('./controlplane.ts'),
  'audit-query': () => import('./audit-query.ts'),
  broker: () => import('./broker.ts'),
  gateway: () => import('./gateway.ts'),
  session: () => import('./session.ts'),
  all: () => import('./all.ts'),
};

const [name, ...args] = process.argv.slice(2);
if (!name || !(name in BENCHES)) {
  process.stderr.write(`usage: npm run bench -- <${Object.keys(BENCHES).join('|')}> [options]\n`);
  process.exit(2);
}
const result = await (await BENCHES[name]()).main(args);
const summaryFile = process.env[SUMMARY_FILE_ENV];
if (summaryFile && result) writeFileSync(summaryFile, JSON.stringify(result.summary));
