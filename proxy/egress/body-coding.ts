import type { Transform } from 'node:stream';
import zlib from 'node:zlib';

// Content codings (RFC 9110 §8.4) of the bodies the gateway reads: a request body is inspected as the
// destination will read it, so a gzip-encoded body hides nothing from the pipeline, and a captured
// response is recorded as text. The bytes forwarded are always the ones the agent or the destination
// sent; only what is inspected and recorded is decoded.
//
// Decoding is bounded by its output (a 16 KiB brotli body can expand to gigabytes) and never throws:
// a body cut short (a captured prefix) decodes as far as it goes.

/** A decoder, and how many input bytes it has read (`bytesWritten`). */
type Decoder = Transform & zlib.Zlib;

const DECODERS: Record<string, () => Decoder> = {
  gzip: () => zlib.createGunzip(),
  'x-gzip': () => zlib.createGunzip(),
  deflate: () => zlib.createInflate(),
  br: () => zlib.createBrotliDecompress(),
  zstd: () => zlib.createZstdDecompress(),
};

/**
 * The most content codings a body may have to be decoded (real clients apply one). Each layer may
 * decode to the bound of its caller (32 MB for an inspected request): a header naming a coding
 * thousands of times must not buy thousands of such decodes.
 */
export const MAX_CODINGS = 3;

/** The codings applied, in the order they were applied; [] for none or identity. */
export function codingsOf(header: string | string[] | undefined): string[] {
  const text = Array.isArray(header) ? header.join(',') : (header ?? '');
  return text
    .split(',')
    .map((c) => c.trim().toLowerCase())
    .filter((c) => c !== '' && c !== 'identity');
}

/** The first coding of the list the gateway cannot decode, or null. */
export function undecodable(codings: readonly string[]): string | null {
  for (const c of codings) if (!Object.hasOwn(DECODERS, c)) return c;
  return null;
}

export interface Decoded {
  body: Buffer;
  /** The decoded body is longer than `max` (`body` holds its first `max` bytes). */
  overflow: boolean;
  /** A decoder stopped on bytes it could not read (a cut or corrupt body). */
  broken: boolean;
}

/** `bytes` with `codings` undone (last applied, first undone), at most `max` bytes of it; stops at the first layer past `max`. */
export async function decodeBody(bytes: Buffer, codings: readonly string[], max: number): Promise<Decoded> {
  let out: Decoded = { body: bytes, overflow: false, broken: false };
  for (let i = codings.length - 1; i >= 0; i--) {
    const make = DECODERS[codings[i]];
    if (make === undefined) return { body: Buffer.alloc(0), overflow: false, broken: true };
    const step = await decodeOne(make(), out.body, max);
    out = { body: step.body, overflow: out.overflow || step.overflow, broken: out.broken || step.broken };
    // Past the bound the body is refused (or recorded as far as it goes): decoding the layers under a
    // cut output would be work for nothing, as much as the bound again per layer.
    if (out.overflow) return out;
  }
  return out;
}

function decodeOne(decoder: Decoder, input: Buffer, max: number): Promise<Decoded> {
  return new Promise((resolve) => {
    const chunks: Buffer[] = [];
    let size = 0;
    let settled = false;
    const finish = (overflow: boolean, broken: boolean) => {
      if (settled) return;
      settled = true;
      decoder.destroy();
      const body = Buffer.concat(chunks, size);
      resolve({ body: body.length > max ? body.subarray(0, max) : body, overflow, broken });
    };
    decoder.on('data', (chunk: Buffer) => {
      chunks.push(chunk);
      size += chunk.length;
      if (size > max) finish(true, false);
    });
    // Bytes the decoder left unread after its stream ended (node's gunzip stops at anything that is not
    // another gzip member, its zstd decoder after the first frame) are read by other decoders: Python's
    // gzip skips zero padding and decodes the member behind it, the zstd format is a sequence of frames.
    // A body whose every byte was not decoded here is not the body inspected: broken.
    decoder.on('end', () => finish(false, decoder.bytesWritten < input.length));
    decoder.on('error', () => finish(false, true));
    decoder.end(input);
  });
}
