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

import { block, br, brIf, instantiate, loop, moduleOf, op, V128 } from './wasm-module.ts';
import { copyIntoSpare } from './shared-bytes.ts';

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
    copyIntoSpare(s.memory, 0, bytes, at, at + length);
    // The last vector's tail is padded with spaces, which are no control.
    const padded = (length + 15) & ~15;
    s.memory.fill(0x20, length, padded);
    if (s.scan(0, padded) !== 0) return true;
  }
  return false;
}

/**
 * The module (wasm-module.ts writes it out; WebAssembly SIMD opcodes). In text format:
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
  const [P, PEND, V, ACC] = [0, 1, 2, 3];
  const splat = (b: number) => [...op.const(b), ...op.i8x16Splat];
  return moduleOf(2, [
    {
      name: 'scan',
      params: 2,
      locals: [V128, V128],
      code: [
        block(
          'done',
          loop(
            'step',
            [...op.get(P), ...op.get(PEND), ...op.geU],
            brIf('done'),
            [...op.get(P), ...op.v128Load(0), ...op.set(V)],
            op.get(ACC),
            [...op.get(V), ...splat(0x20), ...op.i8x16LtU],
            [...op.get(V), ...splat(9), ...op.i8x16Sub, ...splat(5), ...op.i8x16LtU],
            op.v128Andnot,
            [...op.get(V), ...splat(0x7f), ...op.i8x16Eq],
            op.v128Or,
            op.v128Or,
            op.set(ACC),
            [...op.get(P), ...op.const(16), ...op.add, ...op.set(P)],
            br('step'),
          ),
        ),
        [...op.get(ACC), ...op.v128AnyTrue],
      ],
    },
  ]);
}

function instantiateScanner(): Scanner | null {
  const module = instantiate<{ scan: Scanner['scan'] }>(moduleBytes());
  return module && { memory: module.memory, scan: module.exports.scan };
}

const simd = instantiateScanner();

/** Which scan answers in this process (the pipeline bench's conditions name it). */
export const hiddenControlScan: 'simd' | 'scalar' = simd === null ? 'scalar' : 'simd';
