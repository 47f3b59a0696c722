import { readFileSync } from 'node:fs';
import { mkdir, open, readFile, unlink } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { WalDirBusyError } from './errors.ts';

// One writer per WAL directory. With `--workers N` several processes spool side by side, each in its
// own directory; two on one directory would interleave segments and checkpoints. A sink takes
// `<dir>/wal.lock` (created exclusively, holding `{pid, start}`) before it opens a table and removes
// it on close. A lock whose holder is gone is taken over: the holder is gone when its pid is not alive
// or, on Linux, when the process with that pid started at another time (pids are reused, and in a
// container a restarted component often gets the very pid of the one before it).

export const WAL_LOCK_FILE = 'wal.lock';

/** Directories this process holds: a second sink on one of them is refused like another process's. */
const heldHere = new Set<string>();

interface Holder {
  pid: number;
  /** Start time of the process in clock ticks since boot (/proc/<pid>/stat field 22), when known. */
  start: number | null;
}

function startTime(pid: number): number | null {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // The command name (field 2) may hold spaces and parentheses: count fields after the last ')'.
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    const ticks = Number(fields[19]);
    return Number.isFinite(ticks) ? ticks : null;
  } catch {
    return null; // not Linux, or the process is gone
  }
}

function alive(holder: Holder): boolean {
  try {
    process.kill(holder.pid, 0);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EPERM') return false;
  }
  if (holder.start === null) return true;
  const now = startTime(holder.pid);
  return now === null || now === holder.start;
}

async function readHolder(path: string): Promise<Holder | null> {
  try {
    const h = JSON.parse(await readFile(path, 'utf8')) as Partial<Holder>;
    return typeof h.pid === 'number' ? { pid: h.pid, start: typeof h.start === 'number' ? h.start : null } : null;
  } catch {
    return null;
  }
}

/** Takes the directory's lock or throws WalDirBusyError; resolves with its release. */
export async function lockWalDir(dir: string): Promise<() => Promise<void>> {
  const key = resolve(dir);
  if (heldHere.has(key)) throw new WalDirBusyError(`audit WAL directory ${dir} is already open in this process`);
  await mkdir(dir, { recursive: true });
  const path = join(dir, WAL_LOCK_FILE);
  const me: Holder = { pid: process.pid, start: startTime(process.pid) };
  for (let attempt = 0; ; attempt++) {
    try {
      const handle = await open(path, 'wx');
      try {
        await handle.writeFile(JSON.stringify(me));
        await handle.sync();
      } finally {
        await handle.close();
      }
      break;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
    }
    const holder = await readHolder(path);
    // Unreadable or empty: a holder between create and write; give it a moment, then take over.
    if (holder ? alive(holder) : attempt < 20) {
      if (holder) throw new WalDirBusyError(`audit WAL directory ${dir} is in use by process ${holder.pid}`);
      await new Promise((r) => setTimeout(r, 25));
      continue;
    }
    await unlink(path).catch((err: NodeJS.ErrnoException) => {
      if (err.code !== 'ENOENT') throw err;
    });
  }
  heldHere.add(key);
  return async () => {
    heldHere.delete(key);
    await unlink(path).catch(() => {
      // Gone already, or not removable: a lock left behind is taken over once we are gone.
    });
  };
}
