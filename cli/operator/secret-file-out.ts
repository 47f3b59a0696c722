import { type FileHandle, open, unlink } from 'node:fs/promises';
import { CliError } from '../errors.ts';
import { EXIT_UNAVAILABLE, EXIT_USAGE } from '../exit-codes.ts';

// Secret material the control plane hands out once (a service account's key, an enclave's broker key)
// goes to a file the caller names, mode 0600, never over an existing file. The file is created before
// the request is sent, so a path that cannot be written fails with nothing changed on the server; a
// request that fails removes the empty file again (docs/cli.md, "Secret material").

export class SecretFileOut {
  readonly path: string;
  #handle: FileHandle | undefined;

  private constructor(path: string, handle: FileHandle) {
    this.path = path;
    this.#handle = handle;
  }

  /** Creates `path` exclusively (O_EXCL, 0600); refuses a path that exists. */
  static async create(path: string | undefined, flag = '--key-out'): Promise<SecretFileOut> {
    if (!path) throw new CliError(`${flag} FILE is required: the key is secret and is written to a file`, EXIT_USAGE);
    try {
      return new SecretFileOut(path, await open(path, 'wx', 0o600));
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      throw new CliError(
        code === 'EEXIST' ? `${flag} ${path} exists; refusing to overwrite it` : `${flag} ${path}: ${code ?? err}`,
        EXIT_USAGE,
        { cause: err },
      );
    }
  }

  /** Writes the secret as JSON (with a final newline) and closes the file. */
  async write(secret: unknown): Promise<void> {
    const h = this.#handle;
    this.#handle = undefined;
    if (!h) throw new Error('secret file already written');
    try {
      await h.writeFile(`${JSON.stringify(secret, null, 2)}\n`);
    } finally {
      await h.close();
    }
  }

  /** The request failed: the empty file goes away. */
  async discard(): Promise<void> {
    const h = this.#handle;
    this.#handle = undefined;
    if (!h) return;
    await h.close().catch(() => {});
    await unlink(this.path).catch(() => {});
  }

  /** Runs `fn` (the request), writes what `pick` takes from its answer, discards the file on failure. */
  async around<T>(fn: () => Promise<T>, pick: (answer: T) => unknown): Promise<T> {
    let answer: T;
    try {
      answer = await fn();
    } catch (err) {
      await this.discard();
      throw err;
    }
    // A success that does not carry the secret (an empty or reshaped answer) is no success: nothing is
    // written, the empty file goes, and the operator learns the call may have taken effect regardless.
    let secret: unknown;
    try {
      secret = pick(answer);
    } catch {
      secret = undefined;
    }
    if (secret === undefined || secret === null) {
      await this.discard();
      throw new CliError(
        `the server answered success but its answer held no key for ${this.path} (the change may have been made; check, and rotate the key)`,
        EXIT_UNAVAILABLE,
      );
    }
    await this.write(secret);
    return answer;
  }
}
