import { block, br, brIf, I32, ifThen, instantiate, loop, moduleOf, op, V128 } from './wasm-module.ts';
import { copyIntoSpare } from './shared-bytes.ts';

// A literal found sixteen starts at a time (WebAssembly SIMD), case-insensitive (`(?i)project`) or not.
// A custom pattern's anchor is located once per candidate pattern, and once per pattern when the
// literals replace the set pass (pattern-anchors.ts, locate). re2 finds a folded literal with its
// folded-prefix search at about 0.5 ns a byte, a third of a set pass, and Buffer.indexOf a
// case-sensitive one at memchr's speed only where its first byte is rare (`_` of `acct_` is not, in
// agent JSON). Here two of the literal's bytes, each in either case when it folds, are compared at
// sixteen starts at once, and each start where both agree is checked byte by byte: about 0.1 ms a MB
// whatever the bytes, the copies into the module's memory included.
//
//   view ─ a chunk (16 KB, and the literal's length - 1 bytes past it) at a time ─▶ module memory
//        ─▶ find: starts whose two pivot bytes match, folded ─▶ each checked in full ─▶ OUT (i32 each)
//
// Folding here is ASCII's: a letter and its other case. re2 folds two ASCII letters to characters
// outside ASCII too (`k` to U+212A KELVIN SIGN, `s` to U+017F LONG S: no other, checked over every code
// point in test/pipeline/literal-search.test.ts), so a literal holding `k` or `s` is looked for by its
// longest run without them (`word` of `password`), and the rest of the literal is read around each run
// found, as re2 folds it (pattern-anchors.ts, foldedAround). A folded literal with a byte outside ASCII
// is left to re2.

/**
 * Input bytes per call; the chunk's last literal may run on into the next chunk's first bytes. Small
 * enough that OUT holds a start at every byte of it (a one-byte needle in a flood of it).
 */
const CHUNK = 16384;
/** The longest needle: its bytes and their case masks are tables of this size. */
export const MAX_NEEDLE = 64;

// The module's memory: the needle, its case masks, the probes count, the input, the starts found.
const NEEDLE = 0; // MAX_NEEDLE bytes (lower case when the needle folds)
const CASE = NEEDLE + MAX_NEEDLE; // MAX_NEEDLE bytes: 0x20 where the needle has a letter (OR folds it)
const PROBES = CASE + MAX_NEEDLE; // i32: starts checked in full by the last call
const IN = 256; // CHUNK + MAX_NEEDLE - 1 bytes, then PAD zero bytes
const PAD = 96; // past the input: the last vector loads read up to MAX_NEEDLE + 15 bytes on
const OUT = IN + CHUNK + MAX_NEEDLE + PAD; // i32 per start found
const PAGES = 2;
/** Starts one call can write: more than a chunk has bytes. */
const OUT_CAPACITY = (PAGES * 65536 - OUT) >> 2;
if (OUT_CAPACITY < CHUNK) throw new Error('literal-search: OUT cannot hold a start at every byte of a chunk');

/** What a call returns past its bounds. */
const OVER_HITS = -1;
const OVER_PROBES = -2;

/**
 * A needle: ASCII bytes without `k` or `s` when folded, any bytes when not, with the two bytes the
 * vector compare looks at.
 */
export interface Needle {
  /** Lower case when folded. */
  bytes: Uint8Array;
  /** Letters match either case (ASCII folding); else every byte matches itself only. */
  fold: boolean;
  /** The two positions compared sixteen starts at a time (may be the same one). */
  pivots: readonly [number, number];
}

/** Why `bytes` cannot be a needle here (folded: `bytes` in lower case), or null. */
export function needleProblem(bytes: Uint8Array, fold: boolean): string | null {
  if (bytes.length === 0 || bytes.length > MAX_NEEDLE) return `a needle is 1 to ${MAX_NEEDLE} bytes`;
  if (!fold) return null;
  for (const b of bytes) {
    if (b >= 0x80) return 'a byte outside ASCII';
    if (b >= 0x41 && b <= 0x5a) return 'an upper-case letter (needles are lower case)';
    if (b === 0x6b || b === 0x73) return '`k` or `s` (re2 folds them to characters outside ASCII)';
  }
  return null;
}

interface Finder {
  memory: Uint8Array;
  words: Int32Array;
  find: (...args: number[]) => number;
}

/**
 * Every start of `needle` in `view` (under ASCII case folding when it folds; overlapping ones
 * included), in order;
 * null past `maxHits` starts, past `maxProbes` starts checked in full (a flood of the pivot bytes),
 * or past `deadline` (performance.now(), read between chunks). Throws when the module cannot run:
 * callers ask `needleSearch` first.
 */
export function findNeedle(
  view: Uint8Array,
  needle: Needle,
  maxHits: number,
  maxProbes: number,
  deadline = Number.POSITIVE_INFINITY,
): number[] | null {
  const f = finder;
  if (f === null) throw new Error('the literal search cannot run here');
  const { memory, words } = f;
  const length = needle.bytes.length;
  memory.set(needle.bytes, NEEDLE);
  for (let k = 0; k < length; k++) memory[CASE + k] = needle.fold && isLetter(needle.bytes[k]) ? 0x20 : 0;
  const [p1, p2] = needle.pivots;
  const b1 = needle.bytes[p1];
  const b2 = needle.bytes[p2];
  const other = (b: number) => (needle.fold && isLetter(b) ? b ^ 0x20 : b);
  const starts: number[] = [];
  let probes = 0;
  const n = view.length;
  for (let at = 0; at + length <= n; at += CHUNK) {
    if (at > 0 && performance.now() > deadline) return null;
    // The chunk, and the bytes its last starts' literals run on into.
    const end = Math.min(n, at + CHUNK + length - 1);
    copyIntoSpare(memory, IN, view, at, end);
    memory.fill(0, IN + end - at, IN + end - at + PAD);
    // Starts in [0, limit) of the chunk: in the chunk, and with the whole literal before the view's end.
    const limit = Math.min(CHUNK, end - at - length + 1);
    const found = f.find(
      limit,
      length,
      p1,
      p2,
      b1,
      other(b1),
      b2,
      other(b2),
      Math.min(OUT_CAPACITY, maxHits - starts.length),
      maxProbes - probes,
    );
    if (found < 0) return null;
    probes += words[PROBES >> 2];
    for (let k = 0; k < found; k++) starts.push(at + words[(OUT >> 2) + k]);
  }
  return starts;
}

const isLetter = (b: number) => (b >= 0x61 && b <= 0x7a) || (b >= 0x41 && b <= 0x5a);

/**
 * The module (wasm-module.ts writes it out; WebAssembly SIMD opcodes). In text format:
 *
 *   (func (export "find") (param $limit $length $p1 $p2 $a1 $b1 $a2 $b2 $maxHits $maxProbes i32)
 *         (result i32)                             ;; starts written to OUT, or -1 / -2 past the bounds
 *     (local $i $bits $s $k $count $probes i32) (local $va1 $vb1 $va2 $vb2 $v v128)
 *     $va1..$vb2 = (i8x16.splat $a1) .. (i8x16.splat $b2)
 *     (block $done (loop $step
 *       (br_if $done (i32.ge_u $i $limit))
 *       $bits = (i8x16.bitmask (v128.and                       ;; each pivot's vector loaded once
 *                 (v128.or (i8x16.eq (local.tee $v (v128.load IN+$i+$p1)) $va1) (i8x16.eq $v $vb1))
 *                 (v128.or (i8x16.eq (local.tee $v (v128.load IN+$i+$p2)) $va2) (i8x16.eq $v $vb2))))
 *       (block $next (loop $bit                                 ;; each start whose pivots agree
 *         (br_if $next (i32.eqz $bits))
 *         $s = $i + (i32.ctz $bits)
 *         (br_if $done (i32.ge_u $s $limit))                    ;; every later start is past it too
 *         $probes += 1  (if (i32.gt_u $probes $maxProbes) (return -2))
 *         $k = 0
 *         (block $miss (block $hit (loop $cmp                   ;; the whole literal, folded by OR 0x20
 *           (br_if $hit (i32.ge_u $k $length))
 *           (br_if $miss (i32.ne (i32.or IN[$s + $k] CASE[$k]) NEEDLE[$k]))
 *           $k += 1 (br $cmp)))
 *           (if (i32.ge_u $count $maxHits) (return -1))
 *           OUT[$count] = $s  $count += 1)
 *         $bits &= $bits - 1 (br $bit)))
 *       $i += 16 (br $step)))
 *     PROBES = $probes
 *     $count)
 *
 * OR 0x20 folds exactly: only `X` and `x` give `x` for a letter; a needle's other bytes, and every
 * byte of a needle that does not fold, are compared as they are (CASE is 0 there).
 */
function moduleBytes(): Uint8Array {
  const [LIMIT, LENGTH, P1, P2, A1, B1, A2, B2, MAX_HITS, MAX_PROBES] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9];
  const [I, BITS, S, K, COUNT, N_PROBES, VA1, VB1, VA2, VB2, V] = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20];
  const { get, set } = op;
  const splat = (local: number, into: number) => [...get(local), ...op.i8x16Splat, ...set(into)];
  /** The sixteen bytes at a pivot, loaded once, equal to either of its two forms. */
  const pivotMatches = (pivot: number, a: number, b: number) => [
    ...[...get(I), ...get(pivot), ...op.add, ...op.v128Load(IN), ...op.tee(V)],
    ...[...get(a), ...op.i8x16Eq, ...get(V), ...get(b), ...op.i8x16Eq, ...op.v128Or],
  ];
  return moduleOf(PAGES, [
    {
      name: 'find',
      params: 10,
      locals: [I32, I32, I32, I32, I32, I32, V128, V128, V128, V128, V128],
      code: [
        splat(A1, VA1),
        splat(B1, VB1),
        splat(A2, VA2),
        splat(B2, VB2),
        block(
          'done',
          loop(
            'step',
            [...get(I), ...get(LIMIT), ...op.geU],
            brIf('done'),
            [...pivotMatches(P1, VA1, VB1), ...pivotMatches(P2, VA2, VB2), ...op.v128And],
            [...op.i8x16Bitmask, ...set(BITS)],
            block(
              'next',
              loop(
                'bit',
                [...get(BITS), ...op.eqz],
                brIf('next'),
                [...get(I), ...get(BITS), ...op.ctz, ...op.add, ...set(S)],
                [...get(S), ...get(LIMIT), ...op.geU],
                brIf('done'),
                [...get(N_PROBES), ...op.const(1), ...op.add, ...op.tee(N_PROBES), ...get(MAX_PROBES), ...op.gtU],
                ifThen([[...op.const(OVER_PROBES), ...op.return]]),
                [...op.const(0), ...set(K)],
                block(
                  'miss',
                  block(
                    'hit',
                    loop(
                      'cmp',
                      [...get(K), ...get(LENGTH), ...op.geU],
                      brIf('hit'),
                      [...get(S), ...get(K), ...op.add, ...op.load8(IN)],
                      [...get(K), ...op.load8(CASE), ...op.or],
                      [...get(K), ...op.load8(NEEDLE), ...op.ne],
                      brIf('miss'),
                      [...get(K), ...op.const(1), ...op.add, ...set(K)],
                      br('cmp'),
                    ),
                  ),
                  [...get(COUNT), ...get(MAX_HITS), ...op.geU],
                  ifThen([[...op.const(OVER_HITS), ...op.return]]),
                  [...get(COUNT), ...op.const(2), ...op.shl, ...get(S), ...op.store(OUT)],
                  [...get(COUNT), ...op.const(1), ...op.add, ...set(COUNT)],
                ),
                [...get(BITS), ...get(BITS), ...op.const(1), ...op.sub, ...op.and, ...set(BITS)],
                br('bit'),
              ),
            ),
            [...get(I), ...op.const(16), ...op.add, ...set(I)],
            br('step'),
          ),
        ),
        [...op.const(PROBES), ...get(N_PROBES), ...op.store(0)],
        get(COUNT),
      ],
    },
  ]);
}

function instantiateFinder(): Finder | null {
  const module = instantiate<{ find: Finder['find'] }>(moduleBytes());
  return module && { memory: module.memory, words: new Int32Array(module.memory.buffer), find: module.exports.find };
}

const finder = instantiateFinder();

/** Whether the SIMD search runs in this process (else re2 and Buffer.indexOf locate every literal). */
export const needleSearch: 'simd' | 'none' = finder === null ? 'none' : 'simd';
