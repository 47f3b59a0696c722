// The control characters a reader does not see (docs/decisions.md, "Evasion: the normalized view"):
// the C0 controls and DEL that are not white space, U+0000–0008, U+000E–001F and U+007F. Tab, line
// feed, VT, form feed and carriage return are white space and stay. `A\u0000K\u0000I\u0000A…` reads as
// the key to whoever receives it, so the normalized view drops them, as it drops the C1 controls.
//
// They are ASCII, so the view's prefilter (all ASCII and no `&`: nothing to build) cannot turn a body
// away without knowing whether it holds one, on every body, at a cost of its own. A scalar word test
// cost 0.44–0.58 ms per MB (a line break in most words sends it to the byte-by-byte path); a SIMD scan
// sixteen bytes at a time, in WebAssembly, costs about 0.1 ms per MB, the copy into its memory
// included (bench/normalized-view.ts). Node needs WebAssembly to run TypeScript at all; where the CPU
// cannot run its SIMD (x64 without SSE4.1), the module does not compile and the word test answers.
// Both give the same answer (test/pipeline/hidden-controls.test.ts).

/** 1 for the bytes the normalized view drops as hidden controls. */
export const HIDDEN_CONTROL = new Uint8Array(256);
for (let b = 0; b < 0x20; b++) if (b < 0x09 || b > 0x0d) HIDDEN_CONTROL[b] = 1;
HIDDEN_CONTROL[0x7f] = 1;

/** Whether `bytes` hold a hidden control. */
export function holdsHiddenControl(bytes: Uint8Array): boolean {
  return simd === null ? holdsHiddenControlScalar(bytes) : holdsHiddenControlSimd(bytes, simd);
}

/**
 * The word test: a 32-bit word may hold one when a byte is below 0x20 or is 0x7f (the exact
 * any-byte-below test, and the zero-byte test of word ^ 0x7f7f7f7f; both flag every such word, with
 * false positives only from bytes of 0x80 and up), and its bytes are then read one by one.
 */
export function holdsHiddenControlScalar(bytes: Uint8Array): boolean {
  const n = bytes.length;
  const offset = bytes.byteOffset;
  let i = 0;
  for (; i < n && ((offset + i) & 3) !== 0; i++) if (HIDDEN_CONTROL[bytes[i]]) return true;
  const words = (n - i) >> 2;
  if (words > 0) {
    const view = new Int32Array(bytes.buffer, offset + i, words);
    for (let k = 0; k < words; k++) {
      const w = view[k];
      const x = w ^ 0x7f7f7f7f;
      if ((((w - 0x20202020) & ~w) | ((x - 0x01010101) & ~x)) & 0x80808080) {
        const at = i + (k << 2);
        const any =
          HIDDEN_CONTROL[bytes[at]] |
          HIDDEN_CONTROL[bytes[at + 1]] |
          HIDDEN_CONTROL[bytes[at + 2]] |
          HIDDEN_CONTROL[bytes[at + 3]];
        if (any !== 0) return true;
      }
    }
    i += words << 2;
  }
  for (; i < n; i++) if (HIDDEN_CONTROL[bytes[i]]) return true;
  return false;
}

// ---------- the SIMD scan ----------

/** Bytes scanned per call: the input is copied into the module's memory a chunk at a time. */
const CHUNK = 65536;

interface Scanner {
  memory: Uint8Array;
  /** Whether memory[from, to) holds a hidden control; `to - from` is a multiple of 16. */
  scan: (from: number, to: number) => number;
}

function holdsHiddenControlSimd(bytes: Uint8Array, s: Scanner): boolean {
  const n = bytes.length;
  for (let at = 0; at < n; at += CHUNK) {
    const length = at + CHUNK < n ? CHUNK : n - at;
    s.memory.set(bytes.subarray(at, at + length), 0);
    // The last vector's tail is padded with spaces, which are no control.
    const padded = (length + 15) & ~15;
    s.memory.fill(0x20, length, padded);
    if (s.scan(0, padded) !== 0) return true;
  }
  return false;
}

/**
 * The module, written out byte by byte (WebAssembly binary format, with the SIMD proposal's opcodes;
 * it is small enough to read, and needs no toolchain). In text format:
 *
 *   (module
 *     (memory (export "memory") 2)                              ;; 128 KB: one chunk, and room
 *     (func (export "scan") (param $p i32) (param $end i32) (result i32)
 *       (local $v v128) (local $acc v128)
 *       (block (loop
 *         (br_if 1 (i32.ge_u (local.get $p) (local.get $end)))
 *         (local.set $v (v128.load (local.get $p)))
 *         (local.set $acc (v128.or (local.get $acc) (v128.or
 *           (v128.andnot (i8x16.lt_u (local.get $v) (i8x16.splat (i32.const 0x20)))       ;; below 0x20
 *                        (i8x16.lt_u (i8x16.sub (local.get $v) (i8x16.splat (i32.const 9)))
 *                                    (i8x16.splat (i32.const 5))))                       ;; but not 9–13
 *           (i8x16.eq (local.get $v) (i8x16.splat (i32.const 0x7f))))))                    ;; or DEL
 *         (local.set $p (i32.add (local.get $p) (i32.const 16)))
 *         (br 0)))
 *       (v128.any_true (local.get $acc))))
 *
 * No early exit inside a chunk: the loop has no branch on the data, and a chunk is 64 KB.
 */
function moduleBytes(): Uint8Array {
  const uleb = (n: number): number[] => {
    const out: number[] = [];
    do {
      let b = n & 0x7f;
      n >>>= 7;
      if (n !== 0) b |= 0x80;
      out.push(b);
    } while (n !== 0);
    return out;
  };
  const name = (text: string) => [...uleb(text.length), ...Buffer.from(text, 'latin1')];
  const section = (id: number, body: number[]) => [id, ...uleb(body.length), ...body];
  const simdOp = (op: number) => [0xfd, ...uleb(op)];
  // i32.const of a value up to 63 (one signed LEB byte), then i8x16.splat.
  const splat = (b: number) => [0x41, b, ...simdOp(0x0f)];
  const [GET, SET, I32_GE_U, I32_ADD, BR, BR_IF, END] = [0x20, 0x21, 0x4f, 0x6a, 0x0c, 0x0d, 0x0b];
  const [LOAD, EQ, LT_U, ANDNOT, OR, ANY_TRUE, SUB] = [0x00, 0x23, 0x26, 0x4f, 0x50, 0x53, 0x71];
  const P = 0;
  const PEND = 1;
  const V = 2;
  const ACC = 3;
  const body = [
    ...[1, 2, 0x7b], // locals: two v128
    ...[0x02, 0x40, 0x03, 0x40], // block, loop
    ...[GET, P, GET, PEND, I32_GE_U, BR_IF, 1],
    ...[GET, P, ...simdOp(LOAD), 0, 0, SET, V],
    ...[GET, ACC],
    ...[GET, V, ...splat(0x20), ...simdOp(LT_U)],
    ...[GET, V, ...splat(9), ...simdOp(SUB), ...splat(5), ...simdOp(LT_U)],
    ...simdOp(ANDNOT),
    // i32.const 0x7f takes two signed LEB bytes (one byte 0x7f would be -1).
    ...[GET, V, 0x41, 0xff, 0x00, ...simdOp(0x0f), ...simdOp(EQ)],
    ...simdOp(OR),
    ...simdOp(OR),
    ...[SET, ACC],
    ...[GET, P, 0x41, 16, I32_ADD, SET, P],
    ...[BR, 0, END, END],
    ...[GET, ACC, ...simdOp(ANY_TRUE), END],
  ];
  return new Uint8Array([
    ...[0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00],
    ...section(1, [1, 0x60, 2, 0x7f, 0x7f, 1, 0x7f]), // type: (i32, i32) -> i32
    ...section(3, [1, 0]), // function 0 has type 0
    ...section(5, [1, 0x00, 2]), // one memory, two pages, no maximum
    ...section(7, [2, ...name('memory'), 0x02, 0, ...name('scan'), 0x00, 0]),
    ...section(10, [1, ...uleb(body.length), ...body]),
  ]);
}

/** The part of the WebAssembly JS API used here (the `dom` lib that declares it is not loaded). */
interface WebAssemblyApi {
  Module: new (bytes: Uint8Array) => object;
  Instance: new (module: object) => { exports: { memory: { buffer: ArrayBuffer }; scan: Scanner['scan'] } };
}

function instantiate(): Scanner | null {
  try {
    const api = (globalThis as { WebAssembly?: WebAssemblyApi }).WebAssembly;
    if (api === undefined) return null;
    const instance = new api.Instance(new api.Module(moduleBytes()));
    return { memory: new Uint8Array(instance.exports.memory.buffer), scan: instance.exports.scan };
  } catch {
    // No WebAssembly SIMD on this CPU: the word test answers.
    return null;
  }
}

const simd = instantiate();

/** Which scan answers in this process (the benchmark's conditions name it). */
export const hiddenControlScan: 'simd' | 'scalar' = simd === null ? 'scalar' : 'simd';
