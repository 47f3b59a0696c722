import { readFile } from 'node:fs/promises';
import { CliError } from '../errors.ts';
import { EXIT_USAGE } from '../exit-codes.ts';

// A request body given as `--file F` or `--file -` (stdin): read and parsed here, so a file that is
// not a JSON object fails with exit 2 before anything is sent (docs/cli.md, "Request bodies").

const MAX_BODY_BYTES = 4 * 1024 * 1024;

async function readStdin(): Promise<string> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of process.stdin) {
    size += (chunk as Buffer).length;
    if (size > MAX_BODY_BYTES) throw new CliError(`stdin is larger than ${MAX_BODY_BYTES} bytes`, EXIT_USAGE);
    chunks.push(chunk as Buffer);
  }
  return Buffer.concat(chunks).toString('utf8');
}

/** The text of `file` (`-` is stdin), bounded; a file that cannot be read is a usage error naming it. */
export async function readTextArg(file: string, what = '--file'): Promise<string> {
  if (file === '-') return readStdin();
  try {
    const text = await readFile(file, 'utf8');
    if (Buffer.byteLength(text) > MAX_BODY_BYTES)
      throw new CliError(`${what} ${file} is larger than ${MAX_BODY_BYTES} bytes`, EXIT_USAGE);
    return text;
  } catch (err) {
    if (err instanceof CliError) throw err;
    throw new CliError(
      `${what} ${file}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`,
      EXIT_USAGE,
      {
        cause: err,
      },
    );
  }
}

/** The JSON object in `file` (`-` is stdin); anything else is a usage error. */
export async function readJsonBody(file: string): Promise<Record<string, unknown>> {
  const text = await readTextArg(file);
  const where = file === '-' ? 'stdin' : file;
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch (err) {
    throw new CliError(`--file ${where} is not valid JSON: ${(err as Error).message}`, EXIT_USAGE, { cause: err });
  }
  if (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed))
    throw new CliError(`--file ${where} must hold a JSON object`, EXIT_USAGE);
  return parsed as Record<string, unknown>;
}

/** `--file` and body flags are alternatives: one or the other, never merged silently. */
export function fileOrFlags(file: string | undefined, flagsGiven: string[]): void {
  if (file !== undefined && flagsGiven.length > 0)
    throw new CliError(`--file and ${flagsGiven.join(', ')} are alternatives: give one or the other`, EXIT_USAGE);
}
