import { createReadStream } from 'node:fs';
import type { Readable } from 'node:stream';
import { CliError } from '../errors.ts';

// Request bodies and secret values given as a file or on stdin (`--file F`, `--file -`), never as an
// argument: what is read is bounded, and a body that is not JSON fails here, before anything is sent.

/** Larger than any body the operator routes accept (their body limits are smaller). */
const MAX_INPUT_BYTES = 8 * 1024 * 1024;

/**
 * The bytes of `file` (`-`: stdin), bounded; an unreadable file is a usage error naming it. Read as a
 * stream and stopped past the bound, so a file without an end (`/dev/zero`, a FIFO that never closes
 * its side) or a huge one is refused without being held in memory.
 */
export async function readInput(file: string, what: string): Promise<Buffer> {
  if (file === '-' && process.stdin.isTTY) process.stderr.write(`dvx: reading ${what} from stdin (end with Ctrl-D)\n`);
  const source: Readable = file === '-' ? process.stdin : createReadStream(file);
  const named = file === '-' ? `${what} on stdin` : `${what} ${file}`;
  const chunks: Buffer[] = [];
  let size = 0;
  try {
    for await (const chunk of source) {
      size += (chunk as Buffer).length;
      if (size > MAX_INPUT_BYTES) throw new CliError(`${named} is larger than ${MAX_INPUT_BYTES} bytes`);
      chunks.push(chunk as Buffer);
    }
  } catch (err) {
    if (err instanceof CliError) throw err;
    throw new CliError(`cannot read ${what} ${file}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`);
  } finally {
    if (source !== process.stdin) source.destroy();
  }
  return Buffer.concat(chunks);
}

/** The JSON document of `file` (`-`: stdin), or a usage error saying where it is not JSON. */
export async function readJsonInput(file: string, what = '--file'): Promise<unknown> {
  const text = (await readInput(file, what)).toString('utf8');
  if (text.trim() === '') throw new CliError(`${what} ${file === '-' ? '(stdin)' : file} is empty: expected JSON`);
  try {
    return JSON.parse(text);
  } catch (err) {
    throw new CliError(`${what} ${file === '-' ? '(stdin)' : file} is not valid JSON: ${(err as Error).message}`);
  }
}

/** The text of `file` (`-`: stdin), bounded; an unreadable file is a usage error naming it. */
export async function readTextArg(file: string, what = '--file'): Promise<string> {
  return (await readInput(file, what)).toString('utf8');
}

/** The JSON object in `file` (`-`: stdin): a request body; anything else is a usage error. */
export async function readJsonBody(file: string, what = '--file'): Promise<Record<string, unknown>> {
  const parsed = await readJsonInput(file, what);
  if (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed))
    throw new CliError(`${what} ${file === '-' ? '(stdin)' : file} must hold a JSON object`);
  return parsed as Record<string, unknown>;
}

/** `--file` and body flags are alternatives: one or the other, never merged silently. */
export function fileOrFlags(file: string | undefined, flagsGiven: string[]): void {
  if (file !== undefined && flagsGiven.length > 0)
    throw new CliError(`--file and ${flagsGiven.join(', ')} are alternatives: give one or the other`);
}
