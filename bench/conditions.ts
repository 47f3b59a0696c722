import { cpus, loadavg } from 'node:os';

// The machine's conditions, printed with every table: what a reader needs to weigh its numbers. The
// machine is shared, so the load average is given as it was when the bench started and when it printed.

/** The load average when this bench's process loaded its modules: its start. */
const LOAD_AT_START = loadavg();

const load = (l: number[]) => l.map((x) => x.toFixed(2)).join(' / ');

/** What a bench that pins nothing says of its pinning. */
export const UNPINNED = 'not pinned (every process of the bench shares all cores)';

/** One line: Node, CPU, cores, date, load average at the start and now, the pinning, then the bench's own. */
export function conditions(extra: string, pinning: string): string {
  const cpu = cpus()[0]?.model ?? 'unknown cpu';
  return `Node ${process.version}, ${cpu}, ${cpus().length} cores, ${new Date().toISOString().slice(0, 10)}; load average (1/5/15 min) ${load(LOAD_AT_START)} at the start, ${load(loadavg())} at the end; ${pinning}; ${extra}`;
}

/** Node version, CPU, cores, load average and date, for `bench -- all`'s summary. */
export function machineConditions(loadBefore: number[]): string {
  return [
    `Node ${process.version}`,
    cpus()[0]?.model ?? 'unknown cpu',
    `${cpus().length} cores`,
    `load average (1/5/15 min) ${load(loadBefore)} at the start, ${load(loadavg())} at the end`,
    new Date().toISOString().replace(/\.\d+Z$/, 'Z'),
  ].join('; ');
}
