// Buffers lent to one scan for the views it builds, taken back when the scan ends.
//
// The decoded view is written once and read by every detector. Written into a fresh buffer, its pages
// are faulted in as they are first touched: on the bench host a 1 MB copy into a fresh buffer took
// 0.21–0.25 ms and into a reused one 0.04 ms, so a fresh decoded view cost about a tenth of a 1 MB
// scan. A scan borrows its views' buffers from here and gives them back when it ends (scan.ts, in a
// `finally`); the next scan writes over them.
//
// That is safe because nothing a scan returns or keeps holds a view: findings carry strings, the
// caches are keyed by plans and findings, and the input that holds the views is the scan's own. A
// buffer is back on the free list only after its scan has ended, so scans that nest (a byte range's
// whole-body view) borrow different buffers.

/** Buffers from this size are kept for the next scan (a smaller one comes from Node's pool anyway). */
const KEEP_FROM_BYTES = 16 * 1024;
/** The largest buffer kept, and all the kept buffers together: what an idle process holds at most. */
const KEEP_UP_TO_BYTES = 16 * 1024 * 1024;
const KEEP_TOTAL_BYTES = 32 * 1024 * 1024;
/** …and at most this many (a scan borrows one per level of escapes decoded, three at most). */
const KEEP_BUFFERS = 8;

const free: Buffer[] = [];
let freeBytes = 0;

/** One scan's loans: `take` a buffer of at least n bytes (its contents are garbage), `end` them all. */
export class ScratchBuffers {
  #lent: Buffer[] = [];

  take(n: number): Buffer {
    // The smallest free buffer that fits.
    let best = -1;
    for (let k = 0; k < free.length; k++) {
      if (free[k].length >= n && (best < 0 || free[k].length < free[best].length)) best = k;
    }
    let buffer: Buffer;
    if (best >= 0) {
      buffer = free[best];
      free.splice(best, 1);
      freeBytes -= buffer.length;
    } else {
      buffer = Buffer.allocUnsafeSlow(Math.max(n, KEEP_FROM_BYTES));
    }
    this.#lent.push(buffer);
    return buffer;
  }

  /** Every buffer taken goes back to the free list (as far as it keeps them); none may be read after. */
  end(): void {
    for (const buffer of this.#lent) {
      if (buffer.length > KEEP_UP_TO_BYTES) continue;
      // Room is made by dropping the smallest kept buffers first.
      while ((freeBytes + buffer.length > KEEP_TOTAL_BYTES || free.length >= KEEP_BUFFERS) && free.length > 0) {
        let smallest = 0;
        for (let k = 1; k < free.length; k++) if (free[k].length < free[smallest].length) smallest = k;
        freeBytes -= free[smallest].length;
        free.splice(smallest, 1);
      }
      free.push(buffer);
      freeBytes += buffer.length;
    }
    this.#lent = [];
  }
}

/** What the free list holds now (tests). */
export function scratchHeld(): { buffers: number; bytes: number } {
  return { buffers: free.length, bytes: freeBytes };
}
