// Copies into and out of shared memory at memcpy speed.
//
// llmproxy reads a large body straight into a SharedArrayBuffer (engine.ts, allocShared) and the pool's
// workers read it there, uncopied. V8 copies into or out of shared memory (TypedArray.prototype.set,
// Buffer.copy, copyWithin) with relaxed atomic accesses: a word at a time when the source and the
// destination have the same address modulo 8, else a byte at a time, six to ten times slower (on the
// bench host 40–70 µs a MB aligned, 290–550 misaligned; between two buffers of their own a misaligned
// copy is a memmove, about 25). Where a body lands is the stream's business (a chunk after the
// headers, a prefix spliced in), so most copies of a shared body were misaligned: a 1 MB body in shared
// memory scanned 0.3 ms slower than the same bytes in memory of its own, a copy per decoded chunk.
//
// - A scan of a body up to SCAN_COPY_UP_TO_BYTES reads a shared body from one copy of its own, placed at
//   the source's alignment (alignedCopy; scan.ts). A larger one (a byte range of a body split across
//   the pool) is read where it lies: a fresh copy of it would cost more in page faults than it saves.
// - What feeds a WebAssembly module a chunk at a time copies it in at the source's alignment and moves
//   it into place within the module's memory (copyIntoSpare).
// - Other copies that involve shared memory go through copyBytes: misaligned, they pass through a
//   buffer of this thread's, each step aligned where it touches shared memory.

/** Whether `bytes` lies in a SharedArrayBuffer. */
export function isShared(bytes: Uint8Array): boolean {
  return bytes.buffer instanceof SharedArrayBuffer;
}

/**
 * `bytes` copied into memory from `alloc` (at least n bytes, starting at an 8-aligned offset of its
 * ArrayBuffer, as Buffer.allocUnsafeSlow and Node's pool give them), placed at the source's offset
 * modulo 8 so that a shared source is read a word at a time.
 */
export function alignedCopy(bytes: Uint8Array, alloc: (n: number) => Buffer): Buffer {
  const shift = bytes.byteOffset & 7;
  const out = alloc(bytes.length + shift).subarray(shift, shift + bytes.length);
  out.set(bytes);
  return out;
}

/**
 * The largest shared body a scan copies first (alignedCopy): the copy goes into a buffer the scan
 * borrows (scratch-buffers.ts), reused from scan to scan up to this size. Past it (a 32 MB body's
 * 16 MB byte ranges) the copy was a fresh buffer per scan: 15–25 ms more for a 32 MB body through two
 * workers, where copyIntoSpare's chunks already read it at memcpy speed.
 */
export const SCAN_COPY_UP_TO_BYTES = 4 * 1024 * 1024;

/**
 * source[from, to) copied to target at `at`, where target is memory of its own with at least 7 bytes
 * to spare past at + (to - from) (a WebAssembly module's input area): a misaligned shared source is
 * copied in that many bytes on, at its own alignment, then moved back within the target (a memmove).
 */
export function copyIntoSpare(target: Uint8Array, at: number, source: Uint8Array, from: number, to: number): void {
  const shift = (source.byteOffset + from - (target.byteOffset + at)) & 7;
  if (shift === 0 || to - from < BOUNCE_FROM_BYTES || !isShared(source)) {
    target.set(source.subarray(from, to), at);
    return;
  }
  target.set(source.subarray(from, to), at + shift);
  target.copyWithin(at, at + shift, at + shift + (to - from));
}

/** Bytes a bounced copy moves per step (the bounce buffer's size, less the slack for alignment). */
const BOUNCE_BYTES = 64 * 1024;
/** Below this, a misaligned copy is cheaper done as it is than bounced (three calls). */
const BOUNCE_FROM_BYTES = 256;
let bounce: Buffer | null = null;

/**
 * source[sourceStart, sourceEnd) copied to target at targetStart, as Buffer.copy, overlapping ranges of
 * one buffer included (a memmove); the number of bytes copied. Where shared memory is involved and the
 * two addresses differ modulo 8, the bytes pass through a buffer of this thread's in steps of
 * BOUNCE_BYTES, so that neither end is touched a byte at a time: into it at a shared source's
 * alignment, moved within it to a shared target's (a memmove), then out to the target.
 */
export function copyBytes(
  source: Uint8Array,
  target: Uint8Array,
  targetStart = 0,
  sourceStart = 0,
  sourceEnd = source.length,
): number {
  const n = sourceEnd - sourceStart;
  if (n <= 0) return 0;
  if (targetStart < 0 || targetStart + n > target.length || sourceStart < 0 || sourceEnd > source.length)
    throw new RangeError('copyBytes: range out of bounds');
  const shift = (source.byteOffset + sourceStart - (target.byteOffset + targetStart)) & 7;
  const sourceShared = isShared(source);
  const targetShared = isShared(target);
  if (shift === 0 || n < BOUNCE_FROM_BYTES || (!sourceShared && !targetShared)) {
    target.set(source.subarray(sourceStart, sourceEnd), targetStart);
    return n;
  }
  bounce ??= Buffer.allocUnsafeSlow(BOUNCE_BYTES + 16);
  // Overlapping, the target past the source: the last step first, so no step writes over bytes a
  // later one has yet to read.
  const backward = source.buffer === target.buffer && target.byteOffset + targetStart > source.byteOffset + sourceStart;
  const steps = Math.ceil(n / BOUNCE_BYTES);
  for (let s = 0; s < steps; s++) {
    const k = backward ? steps - 1 - s : s;
    const from = sourceStart + k * BOUNCE_BYTES;
    const length = Math.min(BOUNCE_BYTES, sourceEnd - from);
    const to = targetStart + k * BOUNCE_BYTES;
    // Into the bounce at the source's alignment when the source is shared (else at the target's), moved
    // to the target's when the target is shared and it differs.
    const b = (target.byteOffset + to) & 7;
    let at = sourceShared ? (source.byteOffset + from) & 7 : b;
    bounce.set(source.subarray(from, from + length), at);
    if (targetShared && at !== b) {
      bounce.copyWithin(b, at, at + length);
      at = b;
    }
    target.set(bounce.subarray(at, at + length), to);
  }
  return n;
}
