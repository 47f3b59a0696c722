import { execFileSync } from 'node:child_process';
import { readdir, readFile } from 'node:fs/promises';

// What a process under test costs, read from /proc: its resident memory and its CPU time, each of the
// process alone or of it and every process under it (dvx with `--workers N` is a primary and N workers).

const CLOCK_TICKS = (() => {
  try {
    return Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim()) || 100;
  } catch {
    return 100;
  }
})();

/** The pids of a process's direct children (from every one of its threads). */
async function childrenOf(pid: number): Promise<number[]> {
  const tasks = await readdir(`/proc/${pid}/task`).catch(() => [] as string[]);
  const out: number[] = [];
  for (const task of tasks) {
    const list = await readFile(`/proc/${pid}/task/${task}/children`, 'utf8').catch(() => '');
    out.push(...list.split(' ').filter(Boolean).map(Number));
  }
  return out;
}

/** Resident memory of one process in bytes (null: no such process). */
export function rssOf(pid: number | null): Promise<number | null> {
  if (!pid) return Promise.resolve(null);
  return readFile(`/proc/${pid}/status`, 'utf8').then(
    (s) => Number(/VmRSS:\s+(\d+)/.exec(s)?.[1] ?? 0) * 1024,
    () => null,
  );
}

/** Resident memory of a process and all its descendants. */
export async function treeRss(pid: number | null): Promise<number | null> {
  if (!pid) return null;
  const own = await rssOf(pid);
  if (own === null) return null;
  let total = own;
  for (const child of await childrenOf(pid)) total += (await treeRss(child)) ?? 0;
  return total;
}

/** CPU seconds (user + system) of a process and every process under it. */
export async function treeCpuSeconds(pid: number): Promise<number> {
  const stat = await readFile(`/proc/${pid}/stat`, 'utf8').catch(() => '');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  let seconds = (Number(fields[11] ?? 0) + Number(fields[12] ?? 0)) / CLOCK_TICKS;
  for (const child of await childrenOf(pid)) seconds += await treeCpuSeconds(child);
  return seconds;
}
