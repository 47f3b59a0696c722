import { watch, type FSWatcher } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { basename, dirname } from 'node:path';

// A JSON file read at start and re-read when it changes. Writers replace it atomically (write a temp
// file, rename over); we watch the directory, so the rename is seen even though the inode changes.
// A reload that fails to read, parse or validate keeps the last good value and reports the error:
// a bad write never half-applies.

export interface WatchedFileOptions<T> {
  path: string;
  parse: (value: unknown) => T;
  onChange?: (value: T) => void;
  onError?: (err: Error) => void;
  /** Coalesces bursts of events (editors write in several steps). */
  debounceMs?: number;
}

export class WatchedJsonFile<T> {
  #value: T;
  #watcher: FSWatcher | null = null;
  #timer: NodeJS.Timeout | null = null;
  #options: WatchedFileOptions<T>;
  #loading: Promise<void> = Promise.resolve();

  private constructor(options: WatchedFileOptions<T>, value: T) {
    this.#options = options;
    this.#value = value;
  }

  /** Reads and validates the file; throws (with the path) when it cannot. Then watches it. */
  static async open<T>(options: WatchedFileOptions<T>): Promise<WatchedJsonFile<T>> {
    const file = new WatchedJsonFile(options, await readJsonFile(options.path, options.parse));
    file.#watch();
    return file;
  }

  get value(): T {
    return this.#value;
  }

  #watch(): void {
    const name = basename(this.#options.path);
    this.#watcher = watch(dirname(this.#options.path), { persistent: false }, (_event, changed) => {
      if (changed !== null && changed !== name) return;
      if (this.#timer) clearTimeout(this.#timer);
      this.#timer = setTimeout(() => void this.reload(), this.#options.debounceMs ?? 50);
    });
    this.#watcher.on('error', (err) => this.#options.onError?.(err));
  }

  /** Re-reads now; resolves once the new value is in place (or the error reported). */
  reload(): Promise<void> {
    this.#loading = this.#loading.then(async () => {
      try {
        const next = await readJsonFile(this.#options.path, this.#options.parse);
        this.#value = next;
        this.#options.onChange?.(next);
      } catch (err) {
        this.#options.onError?.(err as Error);
      }
    });
    return this.#loading;
  }

  close(): void {
    if (this.#timer) clearTimeout(this.#timer);
    this.#watcher?.close();
    this.#watcher = null;
  }
}

export async function readJsonFile<T>(path: string, parse: (value: unknown) => T): Promise<T> {
  let text: string;
  try {
    text = await readFile(path, 'utf8');
  } catch (err) {
    throw new Error(`cannot read ${path}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`);
  }
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (err) {
    throw new Error(`${path} is not valid JSON: ${(err as Error).message}`);
  }
  try {
    return parse(json);
  } catch (err) {
    throw new Error(`${path}: ${(err as Error).message}`);
  }
}
