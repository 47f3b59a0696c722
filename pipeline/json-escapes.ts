import { block, br, brIf, type Code, I32, ifThen, instantiate, loop, moduleOf, op } from './wasm-module.ts';
import { copyBytes, copyIntoSpare } from './shared-bytes.ts';

// One level of JSON escapes decoded sixteen bytes at a time (json-view.ts, decodeLevel, is the
// definition and the fallback). The decoded view is read by every scan of a JSON body with a backslash
// in it, and the JS walk pays two native calls per escape (an indexOf for the next backslash, a
// copyWithin for the gap): on model traffic, an escape every 70 bytes or so (`\n`, `\"`), about half of
// a 64 KB scan. Here the gaps are found with SIMD compares and moved with memory.copy, and each escape
// is decoded in place, the input copied into the module's memory a chunk at a time.
//
//   body ─ a chunk (64 KB) at a time ─▶ module memory ─▶ decode: find `\` (16 bytes a step), copy the
//   gap, decode the escape ─▶ out (appended) ─▶ the next chunk from the first escape it stopped before
//
// An escape reads at most twelve bytes from its backslash (`\uD83D\uDE00`) and never looks back, so
// a chunk that is not the body's last stops before a backslash within twelve bytes of its end, and the
// next chunk starts there: the output is the JS walk's, byte for byte (test/pipeline/json-escapes.test.ts).

/** Input bytes per call. */
const CHUNK = 65536;

// The module's memory: the tables, the two results, then the input and the output areas.
const SIMPLE = 0; // 257 bytes: the byte a one-letter escape stands for, 0xff for none (and at 256)
const HEX = 512; // 256 bytes: a hex digit's value, 0xff for none
const OUT_LENGTH = 768; // i32: bytes written to OUT
const FLAGS = 772; // i32: 1 an escape was decoded, 2 one was `\u`, `\/`, `\\` or `\b` (hides)
const IN = 1024; // CHUNK bytes, then 16 zero bytes (no backslash: the last SIMD load reads them)
const OUT = IN + CHUNK + 64;
const PAGES = 3;

/** JSON's one-letter escapes `\X`: the letter, and the byte it stands for. */
export const SIMPLE_ESCAPES: readonly (readonly [number, number])[] = [
  [0x22, 0x22],
  [0x5c, 0x5c],
  [0x2f, 0x2f],
  [0x62, 0x08],
  [0x66, 0x0c],
  [0x6e, 0x0a],
  [0x72, 0x0d],
  [0x74, 0x09],
];

/**
 * The module. In text format (locals: $n $final $i $j $to $c $s $cp $next $lo $flags $m; $hex4 reads
 * four hex digits at `at` if they end by `n`, else -1):
 *
 *   (func $hex4 (param $at i32) (param $n i32) (result i32) (local $a $b $c $d i32)
 *     (if (i32.gt_u (i32.add $at 4) $n) (return -1))
 *     $a..$d = HEX[IN[$at]] .. HEX[IN[$at + 3]]
 *     (if (i32.gt_u (i32.or $a $b $c $d) 15) (return -1))
 *     (i32.or (a << 12) (b << 8) (c << 4) d))
 *   (func (export "decode") (param $n i32) (param $final i32) (result i32)   ;; returns input consumed
 *     (block $done (loop $run
 *       $j = $i
 *       (block $found (loop $scan                                   ;; the next backslash, 16 bytes a step
 *         (br_if $found (i32.ge_u $j $n))
 *         $m = (i8x16.bitmask (i8x16.eq (v128.load IN+$j) (i8x16.splat 0x5c)))
 *         (if $m (then $j += (i32.ctz $m) (br $found)))
 *         $j += 16 (br $scan)))
 *       (if (i32.gt_u $j $n) $j = $n)
 *       (memory.copy OUT+$to IN+$i ($j - $i)) $to += $j - $i  $i = $j
 *       (br_if $done (i32.ge_u $i $n))
 *       (if (and (not $final) (i32.gt_u ($i + 12) $n)) (br $done))    ;; the escape may run past the chunk
 *       $c = (select IN[$i + 1] 256 (i32.lt_u ($i + 1) $n))
 *       $s = SIMPLE[$c]
 *       (if (i32.ne $s 0xff) (then
 *         (if (or (= $c '\') (= $c '/') (= $c 'b')) $flags |= 2)
 *         OUT[$to] = $s  $to += 1  $i += 2  $flags |= 1  (br $run)))
 *       (if (i32.eq $c 'u') (then
 *         $flags |= 2
 *         $cp = (call $hex4 ($i + 2) $n)
 *         (if (i32.ge_s $cp 0) (then
 *           $next = $i + 6
 *           (if (and (= ($cp & ~0x3ff) 0xd800) (= IN[$next] '\') (= IN[$next + 1] 'u')) (then
 *             $lo = (call $hex4 ($next + 2) $n)
 *             (if (= ($lo & ~0x3ff) 0xdc00) (then
 *               $cp = 0x10000 + (($cp - 0xd800) << 10) + ($lo - 0xdc00)  $next += 6))))
 *           (if (= ($cp & ~0x7ff) 0xd800) $cp = 0xfffd)                   ;; a lone surrogate
 *           $cp as UTF-8 at OUT[$to], $to += its length
 *           $i = $next  $flags |= 1  (br $run)))))
 *       OUT[$to] = '\'  $to += 1  $i += 1                                  ;; not an escape
 *       (br $run)))
 *     OUT_LENGTH = $to  FLAGS = $flags  $i)
 */
function moduleBytes(): Uint8Array {
  const [AT, N, A, B, C, D] = [0, 1, 2, 3, 4, 5];
  const digit = (local: number, k: number): number[] => [
    ...op.get(AT),
    ...op.load8(IN + k),
    ...op.load8(HEX),
    ...op.set(local),
  ];
  const hex4: Code[] = [
    [...op.get(AT), ...op.const(4), ...op.add, ...op.get(N), ...op.gtU],
    ifThen([[...op.const(-1), ...op.return]]),
    digit(A, 0),
    digit(B, 1),
    digit(C, 2),
    digit(D, 3),
    [...op.get(A), ...op.get(B), ...op.or, ...op.get(C), ...op.or, ...op.get(D), ...op.or, ...op.const(15), ...op.gtU],
    ifThen([[...op.const(-1), ...op.return]]),
    [...op.get(A), ...op.const(12), ...op.shl, ...op.get(B), ...op.const(8), ...op.shl, ...op.or],
    [...op.get(C), ...op.const(4), ...op.shl, ...op.or, ...op.get(D), ...op.or],
  ];

  const [n, final, i, j, to, c, s, cp, next, lo, flags, m] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11];
  const get = op.get;
  const set = op.set;
  /** local += value */
  const inc = (local: number, value: number[]) => [...get(local), ...value, ...op.add, ...set(local)];
  const orFlag = (bit: number) => [...get(flags), ...op.const(bit), ...op.or, ...set(flags)];
  /** OUT[to + k] = value (the value's code) */
  const out = (k: number, value: number[]) => [...get(to), ...value, ...op.store8(OUT + k)];
  const cpShr = (shift: number, mask: number, lead: number) => [
    ...get(cp),
    ...op.const(shift),
    ...op.shrU,
    ...(mask === 0 ? [] : [...op.const(mask), ...op.and]),
    ...op.const(lead),
    ...op.or,
  ];
  const utf8: Code[] = [
    [...get(cp), ...op.const(0x80), ...op.ltU],
    ifThen(
      [out(0, get(cp)), inc(to, op.const(1))],
      [
        [...get(cp), ...op.const(0x800), ...op.ltU],
        ifThen(
          [out(0, cpShr(6, 0, 0xc0)), out(1, cpShr(0, 0x3f, 0x80)), inc(to, op.const(2))],
          [
            [...get(cp), ...op.const(0x10000), ...op.ltU],
            ifThen(
              [
                out(0, cpShr(12, 0, 0xe0)),
                out(1, cpShr(6, 0x3f, 0x80)),
                out(2, cpShr(0, 0x3f, 0x80)),
                inc(to, op.const(3)),
              ],
              [
                out(0, cpShr(18, 0, 0xf0)),
                out(1, cpShr(12, 0x3f, 0x80)),
                out(2, cpShr(6, 0x3f, 0x80)),
                out(3, cpShr(0, 0x3f, 0x80)),
                inc(to, op.const(4)),
              ],
            ),
          ],
        ),
      ],
    ),
  ];
  const isByte = (local: number, b: number) => [...get(local), ...op.const(b), ...op.eq];
  const decode: Code[] = [
    block(
      'done',
      loop(
        'run',
        [...get(i), ...set(j)],
        block(
          'found',
          loop(
            'scan',
            [...get(j), ...get(n), ...op.geU],
            brIf('found'),
            [...get(j), ...op.v128Load(IN), ...op.const(0x5c), ...op.i8x16Splat, ...op.i8x16Eq, ...op.i8x16Bitmask],
            op.tee(m),
            ifThen([[...get(j), ...get(m), ...op.ctz, ...op.add, ...set(j)], br('found')]),
            inc(j, op.const(16)),
            br('scan'),
          ),
        ),
        [...get(j), ...get(n), ...op.gtU],
        ifThen([[...get(n), ...set(j)]]),
        [
          ...get(to),
          ...op.const(OUT),
          ...op.add,
          ...get(i),
          ...op.const(IN),
          ...op.add,
          ...get(j),
          ...get(i),
          ...op.sub,
        ],
        op.memoryCopy,
        inc(to, [...get(j), ...get(i), ...op.sub]),
        [...get(j), ...set(i)],
        [...get(i), ...get(n), ...op.geU],
        brIf('done'),
        [...get(final), ...op.eqz, ...get(i), ...op.const(12), ...op.add, ...get(n), ...op.gtU, ...op.and],
        brIf('done'),
        [...get(i), ...op.load8(IN + 1), ...op.const(256), ...get(i), ...op.const(1), ...op.add, ...get(n), ...op.ltU],
        op.select,
        op.set(c),
        [...get(c), ...op.load8(SIMPLE), ...op.tee(s), ...op.const(0xff), ...op.ne],
        ifThen([
          [...isByte(c, 0x5c), ...isByte(c, 0x2f), ...op.or, ...isByte(c, 0x62), ...op.or],
          ifThen([orFlag(2)]),
          out(0, get(s)),
          inc(to, op.const(1)),
          inc(i, op.const(2)),
          orFlag(1),
          br('run'),
        ]),
        isByte(c, 0x75),
        ifThen([
          orFlag(2),
          [...get(i), ...op.const(2), ...op.add, ...get(n), ...op.call(0), ...set(cp)],
          [...get(cp), ...op.const(0), ...op.geS],
          ifThen([
            [...get(i), ...op.const(6), ...op.add, ...set(next)],
            [...get(cp), ...op.const(~0x3ff), ...op.and, ...op.const(0xd800), ...op.eq],
            [...get(next), ...op.load8(IN), ...op.const(0x5c), ...op.eq, ...op.and],
            [...get(next), ...op.load8(IN + 1), ...op.const(0x75), ...op.eq, ...op.and],
            ifThen([
              [...get(next), ...op.const(2), ...op.add, ...get(n), ...op.call(0), ...set(lo)],
              [...get(lo), ...op.const(~0x3ff), ...op.and, ...op.const(0xdc00), ...op.eq],
              ifThen([
                [...get(cp), ...op.const(0xd800), ...op.sub, ...op.const(10), ...op.shl],
                [...op.const(0x10000), ...op.add, ...get(lo), ...op.add, ...op.const(0xdc00), ...op.sub, ...set(cp)],
                inc(next, op.const(6)),
              ]),
            ]),
            [...get(cp), ...op.const(~0x7ff), ...op.and, ...op.const(0xd800), ...op.eq],
            ifThen([[...op.const(0xfffd), ...set(cp)]]),
            ...utf8,
            [...get(next), ...set(i)],
            orFlag(1),
            br('run'),
          ]),
        ]),
        out(0, op.const(0x5c)),
        inc(to, op.const(1)),
        inc(i, op.const(1)),
        br('run'),
      ),
    ),
    [...op.const(0), ...get(to), ...op.store(OUT_LENGTH)],
    [...op.const(0), ...get(flags), ...op.store(FLAGS)],
    get(i),
  ];
  return moduleOf(PAGES, [
    { name: null, params: 2, locals: [I32, I32, I32, I32], code: hex4 },
    { name: 'decode', params: 2, locals: [I32, I32, I32, I32, I32, I32, I32, I32, I32, I32], code: decode },
  ]);
}

interface Decoder {
  memory: Uint8Array;
  words: Int32Array;
  decode: (n: number, final: number) => number;
}

function instantiateDecoder(): Decoder | null {
  const module = instantiate<{ decode: Decoder['decode'] }>(moduleBytes());
  if (module === null) return null;
  const { memory } = module;
  memory.fill(0xff, SIMPLE, SIMPLE + 257);
  for (const [letter, byte] of SIMPLE_ESCAPES) memory[SIMPLE + letter] = byte;
  memory.fill(0xff, HEX, HEX + 256);
  for (let d = 0; d < 10; d++) memory[HEX + 0x30 + d] = d;
  for (let d = 0; d < 6; d++) memory[HEX + 0x41 + d] = memory[HEX + 0x61 + d] = 10 + d;
  return { memory, words: new Int32Array(memory.buffer, 0, OUT / 4), decode: module.exports.decode };
}

const decoder = instantiateDecoder();

/** Which decoder runs in this process (the pipeline bench's conditions name it). */
export const jsonEscapesDecoder: 'simd' | 'scalar' = decoder === null ? 'scalar' : 'simd';

/** One level of a body's escapes decoded: the view, and what json-view.ts's walk tells of it. */
export interface DecodedLevel {
  /** The body with this level's escapes decoded (valid when `decoded`). */
  bytes: Buffer;
  /** An escape was decoded (else the view is the body itself). */
  decoded: boolean;
  /** An escape the walk met was `\u`, `\/`, `\\` or `\b` (json-view.ts, hidesCharacters). */
  hides: boolean;
}

/**
 * One level of `body`'s escapes decoded, from `from` (its first backslash: the bytes before it are
 * copied as they are), as json-view.ts's walk decodes it; null where the module cannot run. `take`
 * gives the buffer written (at least n bytes; scratch-buffers.ts), else a new one is made.
 */
export function decodeEscapes(
  body: Buffer,
  from: number,
  take: (n: number) => Buffer = Buffer.allocUnsafe,
): DecodedLevel | null {
  if (decoder === null) return null;
  const { memory, words, decode } = decoder;
  const n = body.length;
  const out = take(n);
  copyBytes(body, out, 0, 0, from);
  let to = from;
  let flags = 0;
  for (let at = from; at < n; ) {
    const length = at + CHUNK < n ? CHUNK : n - at;
    const final = at + length === n ? 1 : 0;
    copyIntoSpare(memory, IN, body, at, at + length);
    memory.fill(0, IN + length, IN + length + 16);
    const consumed = decode(length, final);
    const written = words[OUT_LENGTH >> 2];
    out.set(memory.subarray(OUT, OUT + written), to);
    to += written;
    flags |= words[FLAGS >> 2];
    at += consumed;
  }
  return { bytes: out.subarray(0, to), decoded: (flags & 1) !== 0, hides: (flags & 2) !== 0 };
}
