import { open, readFile, rename, writeFile } from 'node:fs/promises';
import { join } from 'node:path';

// The shipper's checkpoint: the position of the first record not yet acknowledged by the store.
// Written atomically (temp file, fsync, rename, fsync of the directory), so a crash leaves the old
// checkpoint or the new one, never a torn one. A checkpoint that lags only re-ships rows, which the
// stores deduplicate by id.

export interface Position {
  segment: number;
  offset: number;
}

const FILE = 'checkpoint.json';

export async function readCheckpoint(dir: string): Promise<Position | null> {
  try {
    const p = JSON.parse(await readFile(join(dir, FILE), 'utf8')) as Position;
    return Number.isInteger(p.segment) && Number.isInteger(p.offset) ? p : null;
  } catch {
    // None yet (first start) or unreadable: shipping starts from the oldest segment, which only
    // re-ships rows the stores deduplicate by id. Nothing is lost either way.
    return null;
  }
}

export async function syncDir(dir: string): Promise<void> {
  const handle = await open(dir, 'r');
  try {
    await handle.sync();
  } finally {
    await handle.close();
  }
}

export async function writeCheckpoint(dir: string, position: Position): Promise<void> {
  const tmp = join(dir, `${FILE}.tmp`);
  await writeFile(tmp, JSON.stringify(position));
  const handle = await open(tmp, 'r+');
  try {
    await handle.datasync();
  } finally {
    await handle.close();
  }
  await rename(tmp, join(dir, FILE));
  await syncDir(dir);
}
