import { createCipheriv, createDecipheriv, randomBytes } from 'node:crypto';
import { readFile, writeFile } from 'node:fs/promises';
import { KmsError } from './errors.ts';

// Key management for per-org data keys (crypto-shred). A KMS wraps and unwraps data keys; the data
// keys never leave the process unwrapped and are never stored unwrapped. Providers:
//   local   --kms-config FILE: {"key": base64 of 32 bytes}, AES-256-GCM; created (0600) if absent
// AWS KMS (Encrypt/Decrypt with a key id) and Vault transit (encrypt/decrypt on a named key) implement
// the same two calls; they plug in behind openKms.

export interface Kms {
  readonly provider: string;
  wrap(dataKey: Buffer): Promise<string>;
  unwrap(wrapped: string): Promise<Buffer>;
}

export function seal(key: Buffer, plaintext: Buffer): string {
  const iv = randomBytes(12);
  const cipher = createCipheriv('aes-256-gcm', key, iv);
  const ct = Buffer.concat([cipher.update(plaintext), cipher.final()]);
  return Buffer.concat([iv, cipher.getAuthTag(), ct]).toString('base64');
}

export function open(key: Buffer, sealed: string): Buffer {
  const buf = Buffer.from(sealed, 'base64');
  if (buf.length < 28) throw new KmsError('sealed value too short');
  const decipher = createDecipheriv('aes-256-gcm', key, buf.subarray(0, 12));
  decipher.setAuthTag(buf.subarray(12, 28));
  return Buffer.concat([decipher.update(buf.subarray(28)), decipher.final()]);
}

class LocalKms implements Kms {
  readonly provider = 'local';
  #key: Buffer;
  constructor(key: Buffer) {
    this.#key = key;
  }
  async wrap(dataKey: Buffer): Promise<string> {
    return `local:v1:${seal(this.#key, dataKey)}`;
  }
  async unwrap(wrapped: string): Promise<Buffer> {
    if (!wrapped.startsWith('local:v1:')) throw new KmsError('not a key wrapped by the local KMS');
    try {
      return open(this.#key, wrapped.slice('local:v1:'.length));
    } catch (err) {
      throw new KmsError('the local KMS cannot unwrap this key (another master key?)', { cause: err });
    }
  }
}

export async function openKms(provider: string, config: string): Promise<Kms> {
  if (provider !== 'local')
    throw new KmsError(
      `--kms-provider ${provider} is not available (local; aws-kms and vault-transit implement the same interface)`,
    );
  if (!config)
    throw new KmsError('--kms-provider local needs --kms-config FILE (the master key file; created if absent)');
  let text: string | null = null;
  try {
    text = await readFile(config, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT')
      throw new KmsError(`cannot read --kms-config ${config}: ${(err as NodeJS.ErrnoException).code}`, { cause: err });
  }
  if (text === null) {
    const key = randomBytes(32);
    await writeFile(config, JSON.stringify({ key: key.toString('base64') }) + '\n', { mode: 0o600, flag: 'wx' });
    return new LocalKms(key);
  }
  let key: Buffer;
  try {
    key = Buffer.from(String((JSON.parse(text) as { key?: unknown }).key ?? ''), 'base64');
  } catch (err) {
    throw new KmsError(`--kms-config ${config} is not valid JSON ({"key": base64})`, { cause: err });
  }
  if (key.length !== 32) throw new KmsError(`--kms-config ${config}: "key" must be 32 bytes, base64`);
  return new LocalKms(key);
}
