import { X509Certificate } from 'node:crypto';
import { readFile } from 'node:fs/promises';
import type { Logger } from '../../core/logger.ts';
import { ImdsOptionsError } from './errors.ts';

// The CA bundle of `--imds-ca-cert`, served at GET /v1/ca: the certificates an agent is to trust (the
// gateway's interception CA, the enclave CA). The file is read again on every request, so a rotated
// bundle is served at once; a read that fails, or a file that no longer holds a certificate, keeps
// the last good bundle and says so in the log.
//
// Only the certificate blocks are served, re-encoded from what parsed: a file that also holds a
// private key (a CA's cert and key in one PEM) is refused at start, and a key that appears later is
// never served (the file is refused as a whole, the last good bundle stays).

const CERT_BLOCK = /-----BEGIN CERTIFICATE-----[\s\S]+?-----END CERTIFICATE-----/g;

/** The bundle's certificates as PEM; throws naming what is wrong with the file (never its content). */
export function certificatesOf(text: string): string {
  if (/PRIVATE KEY-----/.test(text)) throw new Error('holds a private key; imds serves certificates only');
  const blocks = text.match(CERT_BLOCK) ?? [];
  if (blocks.length === 0) throw new Error('holds no PEM certificate');
  return blocks
    .map((block, i) => {
      try {
        return new X509Certificate(block).toString();
      } catch (err) {
        throw new Error(`certificate ${i + 1} does not parse`, { cause: err });
      }
    })
    .join('');
}

export class CaBundle {
  readonly #path: string;
  readonly #log: Logger;
  #pem: Buffer;

  private constructor(path: string, pem: Buffer, log: Logger) {
    this.#path = path;
    this.#pem = pem;
    this.#log = log;
  }

  /** Reads and checks the bundle; a file that cannot serve refuses the start. */
  static async open(path: string, log: Logger): Promise<CaBundle> {
    try {
      return new CaBundle(path, Buffer.from(certificatesOf(await readFile(path, 'utf8'))), log);
    } catch (err) {
      const why = (err as NodeJS.ErrnoException).code ?? (err as Error).message;
      throw new ImdsOptionsError(`--imds-ca-cert ${path}: ${why}`, { cause: err });
    }
  }

  /** The bundle as the file holds it now, else the last good one. */
  async read(): Promise<Buffer> {
    try {
      const pem = Buffer.from(certificatesOf(await readFile(this.#path, 'utf8')));
      if (!pem.equals(this.#pem)) this.#log.info({ ca: this.#path }, 'imds CA bundle changed');
      this.#pem = pem;
    } catch (err) {
      this.#log.error({ err, ca: this.#path }, 'imds CA bundle cannot be read again; serving the last good one');
    }
    return this.#pem;
  }
}
