import { performance } from 'node:perf_hooks';
import { p50p99 } from './stats.ts';

// Timing helpers shared by every benchmark: run a contender until it has enough samples or spent its
// budget, and summarise as median/p99 and MB/s; and how times, sizes and tables are printed. Speed is judged here, never in a test.

export interface Sample {
  p50: number; // ms
  p99: number; // ms
  n: number;
}

export async function measure(
  fn: () => unknown,
  options: { budgetMs?: number; minRuns?: number; maxRuns?: number; warmup?: number } = {},
): Promise<Sample> {
  const budget = options.budgetMs ?? 1500;
  const minRuns = options.minRuns ?? 5;
  const maxRuns = options.maxRuns ?? 100_000;
  for (let i = 0; i < (options.warmup ?? 3); i++) await fn();
  const times: number[] = [];
  const start = performance.now();
  while (times.length < maxRuns && (times.length < minRuns || performance.now() - start < budget)) {
    const t0 = performance.now();
    const r = fn();
    if (r instanceof Promise) await r;
    times.push(performance.now() - t0);
  }
  return { ...p50p99(times), n: times.length };
}

export function mbPerSec(bytes: number, ms: number): number {
  return bytes / 1e6 / (ms / 1000);
}

export function formatMs(ms: number): string {
  if (ms < 1) return `${(ms * 1000).toFixed(0)} µs`;
  if (ms < 100) return `${ms.toFixed(2)} ms`;
  return `${ms.toFixed(0)} ms`;
}

export function sizeLabel(bytes: number): string {
  return bytes >= 1024 * 1024 ? `${Math.round(bytes / 1024 / 1024)} MB` : `${Math.round(bytes / 1024)} KB`;
}

/** A markdown table: header row, then rows, columns padded. */
export function table(header: string[], rows: string[][]): string {
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? '').length)));
  const line = (cells: string[]) => '| ' + cells.map((c, i) => (c ?? '').padEnd(widths[i])).join(' | ') + ' |';
  return [line(header), '|' + widths.map((w) => '-'.repeat(w + 2)).join('|') + '|', ...rows.map(line)].join('\n');
}
