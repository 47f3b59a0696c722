// WebAssembly modules written out in TypeScript, for the few byte loops that JS cannot run at memory
// speed (hidden-controls.ts, json-escapes.ts): the binary format's encodings, a structured way to write
// a function body (labels by name, so no branch depth is counted by hand), and instantiation. No
// toolchain, nothing generated: each module is its own source, its text form in a comment beside it.

/** Unsigned LEB128. */
function uleb(n: number): number[] {
  const out: number[] = [];
  do {
    let b = n & 0x7f;
    n >>>= 7;
    if (n !== 0) b |= 0x80;
    out.push(b);
  } while (n !== 0);
  return out;
}

/** Signed LEB128 of a 32-bit integer. */
function sleb(n: number): number[] {
  const out: number[] = [];
  n |= 0;
  for (;;) {
    const b = n & 0x7f;
    n >>= 7;
    if ((n === 0 && (b & 0x40) === 0) || (n === -1 && (b & 0x40) !== 0)) {
      out.push(b);
      return out;
    }
    out.push(b | 0x80);
  }
}

/**
 * A function body's code: bytes, or a structured instruction whose branch targets are named. A label
 * names the block, loop or if it is given to; `br`/`br_if` to it are encoded with its depth there.
 */
export type Code = number[] | Structured | Branch;
interface Structured {
  op: 'block' | 'loop' | 'if';
  label: string;
  body: Code[];
  else?: Code[];
}
interface Branch {
  op: 'br' | 'br_if';
  label: string;
}

export const block = (label: string, ...body: Code[]): Code => ({ op: 'block', label, body });
export const loop = (label: string, ...body: Code[]): Code => ({ op: 'loop', label, body });
/** `if` on the value on the stack (pushed by the code before it). */
export const ifThen = (body: Code[], otherwise?: Code[]): Code => ({ op: 'if', label: '', body, else: otherwise });
export const br = (label: string): Code => ({ op: 'br', label });
export const brIf = (label: string): Code => ({ op: 'br_if', label });

/** The bytes of `code`, branch depths resolved against the labels it is nested in. */
function assemble(code: readonly Code[], labels: readonly string[] = []): number[] {
  const out: number[] = [];
  for (const c of code) {
    if (Array.isArray(c)) {
      for (const b of c) out.push(b);
      continue;
    }
    if (c.op === 'br' || c.op === 'br_if') {
      const depth = labels.indexOf(c.label);
      if (depth < 0) throw new Error(`no label ${c.label}`);
      out.push(c.op === 'br' ? 0x0c : 0x0d, ...uleb(depth));
      continue;
    }
    const s = c as Structured;
    const inner = [s.label, ...labels];
    out.push(s.op === 'block' ? 0x02 : s.op === 'loop' ? 0x03 : 0x04, 0x40);
    out.push(...assemble(s.body, inner));
    if (s.else) out.push(0x05, ...assemble(s.else, inner));
    out.push(0x0b);
  }
  return out;
}

/** The instructions used, by name (i32 unless said). */
export const op = {
  get: (local: number) => [0x20, ...uleb(local)],
  set: (local: number) => [0x21, ...uleb(local)],
  tee: (local: number) => [0x22, ...uleb(local)],
  call: (index: number) => [0x10, ...uleb(index)],
  const: (value: number) => [0x41, ...sleb(value)],
  load8: (offset: number) => [0x2d, 0x00, ...uleb(offset)],
  store8: (offset: number) => [0x3a, 0x00, ...uleb(offset)],
  store: (offset: number) => [0x36, 0x02, ...uleb(offset)],
  return: [0x0f],
  select: [0x1b],
  eqz: [0x45],
  eq: [0x46],
  ne: [0x47],
  ltU: [0x49],
  gtU: [0x4b],
  geS: [0x4e],
  geU: [0x4f],
  ctz: [0x68],
  add: [0x6a],
  sub: [0x6b],
  and: [0x71],
  or: [0x72],
  shl: [0x74],
  shrU: [0x76],
  /** memory.copy: destination, source, length on the stack. */
  memoryCopy: [0xfc, ...uleb(10), 0x00, 0x00],
  v128Load: (offset: number) => [0xfd, ...uleb(0x00), 0x00, ...uleb(offset)],
  i8x16Splat: [0xfd, ...uleb(0x0f)],
  i8x16Eq: [0xfd, ...uleb(0x23)],
  i8x16LtU: [0xfd, ...uleb(0x26)],
  v128And: [0xfd, ...uleb(0x4e)],
  v128Andnot: [0xfd, ...uleb(0x4f)],
  v128Or: [0xfd, ...uleb(0x50)],
  v128AnyTrue: [0xfd, ...uleb(0x53)],
  i8x16Sub: [0xfd, ...uleb(0x71)],
  i8x16Bitmask: [0xfd, ...uleb(0x64)],
};

export const I32 = 0x7f;
export const V128 = 0x7b;

export interface FunctionSpec {
  /** Exported under this name; null: called by index only. */
  name: string | null;
  params: number;
  /** The locals after the params, by type, in order. */
  locals: number[];
  code: Code[];
}

const name = (text: string) => [...uleb(text.length), ...Buffer.from(text, 'latin1')];
const section = (id: number, body: number[]) => [id, ...uleb(body.length), ...body];

/**
 * A module of functions taking i32 params and returning one i32, and one memory of `pages` 64 KiB
 * pages exported as `memory`. Function i has index i (for `call`).
 */
export function moduleOf(pages: number, functions: readonly FunctionSpec[]): Uint8Array {
  const types = functions.map((f) => [0x60, ...uleb(f.params), ...Array(f.params).fill(I32), 1, I32]);
  const exported = functions.flatMap((f, i) => (f.name === null ? [] : [[...name(f.name), 0x00, ...uleb(i)]]));
  const bodies = functions.map((f) => {
    // Locals in runs of one type each.
    const runs: number[][] = [];
    for (const t of f.locals) {
      const last = runs.at(-1);
      if (last && last[1] === t) last[0]++;
      else runs.push([1, t]);
    }
    const body = [...uleb(runs.length), ...runs.flatMap(([n, t]) => [...uleb(n), t]), ...assemble(f.code), 0x0b];
    return [...uleb(body.length), ...body];
  });
  return new Uint8Array([
    ...[0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00],
    ...section(1, [...uleb(types.length), ...types.flat()]),
    ...section(3, [...uleb(functions.length), ...functions.map((_, i) => i)]),
    ...section(5, [1, 0x00, ...uleb(pages)]),
    ...section(7, [...uleb(exported.length + 1), ...name('memory'), 0x02, 0, ...exported.flat()]),
    ...section(10, [...uleb(bodies.length), ...bodies.flat()]),
  ]);
}

/** The part of the WebAssembly JS API used here (the `dom` lib that declares it is not loaded). */
interface WebAssemblyApi {
  Module: new (bytes: Uint8Array) => object;
  Instance: new (module: object) => { exports: Record<string, unknown> & { memory: { buffer: ArrayBuffer } } };
}

/**
 * The module's exports and its memory, or null where it cannot run (no WebAssembly, or a CPU without
 * the SIMD its code uses: the caller's scalar code answers then).
 */
export function instantiate<E>(bytes: Uint8Array): { memory: Uint8Array; exports: E } | null {
  try {
    const api = (globalThis as { WebAssembly?: WebAssemblyApi }).WebAssembly;
    if (api === undefined) return null;
    const instance = new api.Instance(new api.Module(bytes));
    return { memory: new Uint8Array(instance.exports.memory.buffer), exports: instance.exports as unknown as E };
  } catch {
    return null;
  }
}
