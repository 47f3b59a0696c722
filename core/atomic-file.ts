import { open, rename, rm } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';

// Replaces a file atomically: the content is written and fsynced to a temporary file in the same
// directory, renamed over the target, and the directory fsynced, so a reader (a watcher reloading on
// rename) sees the old file or the new one, never a half-written one, even across a crash.

export interface AtomicWriteOptions {
  /**
   * The file's mode, set on the temporary file before its first byte is written and before the rename
   * (so the content is never readable under a wider mode); the temporary file is then created exclusively.
   */
  mode?: number;
}

export async function writeFileAtomic(
  path: string,
  data: string | Uint8Array,
  options: AtomicWriteOptions = {},
): Promise<void> {
  const tmp = join(dirname(path), `.${basename(path)}.${process.pid}.${Date.now()}.tmp`);
  const file = options.mode === undefined ? await open(tmp, 'w', 0o644) : await open(tmp, 'wx', options.mode & 0o777);
  try {
    // The umask may have narrowed the mode asked for at creation: set it exactly.
    if (options.mode !== undefined) await file.chmod(options.mode & 0o777);
    await file.writeFile(data);
    await file.sync();
  } catch (err) {
    await file.close();
    await rm(tmp, { force: true });
    throw err;
  }
  await file.close();
  try {
    await rename(tmp, path);
  } catch (err) {
    await rm(tmp, { force: true });
    throw err;
  }
  const dir = await open(dirname(path), 'r');
  try {
    await dir.sync();
  } finally {
    await dir.close();
  }
}
