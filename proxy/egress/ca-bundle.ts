import { readFile } from 'node:fs/promises';
import { rootCertificates } from 'node:tls';
import { GatewayOptionsError } from './errors.ts';

// The CAs the gateway trusts for the TLS it originates (llmproxy, the broker): the system's roots and
// an extra bundle (--upstream-ca, --broker-ca). Node's `ca` option replaces the roots when given, so the
// two are joined here.

/** The bundle in `path` (empty: none), or a start refused naming the flag. */
export async function readCaBundle(path: string, flag: string): Promise<Buffer | undefined> {
  if (!path) return undefined;
  try {
    return await readFile(path);
  } catch (err) {
    throw new GatewayOptionsError(
      `cannot read ${flag} ${path}: ${(err as NodeJS.ErrnoException).code ?? 'unreadable'}`,
      { cause: err },
    );
  }
}

/** The `ca` of a TLS connection trusting the system's roots and `extra`; none (the roots) without it. */
export function trusting(extra: Buffer | undefined): { ca?: string[] } {
  return extra ? { ca: [...rootCertificates, extra.toString('utf8')] } : {};
}
