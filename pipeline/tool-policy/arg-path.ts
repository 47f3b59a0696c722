// `arg_gt`'s dotted paths into a tool call's parsed arguments (docs/tool-policy.md, "arg_gt").
//
// `payment.amount` names `args.payment.amount`; array elements by index (`items.0.price`). A key may
// itself hold dots (`{"payment.amount": 900}`): which reading the tool uses is the tool's business, so
// every reading is tried and the path names all the values found (the evaluator counts a bound as met
// when any of them is past it: matching more is never looser, since the strictest verdict wins).
// Only own entries are read (core/own.ts): `constructor` or `__proto__` name a value only when the
// arguments hold such a key themselves.

/** Past this many segments a path is read the plain way only (one key per segment). */
const MAX_SPLIT_SEGMENTS = 16;

/** The path split once, at compile time. */
export function splitPath(path: string): string[] {
  return path.split('.');
}

/** Every value the path names in `root` (none when it names nothing). */
export function valuesAt(root: unknown, segments: readonly string[]): unknown[] {
  const found: unknown[] = [];
  if (segments.length > MAX_SPLIT_SEGMENTS) {
    let node = root;
    for (const key of segments) {
      if (!hasOwnKey(node, key)) return found;
      node = (node as Record<string, unknown>)[key];
    }
    found.push(node);
    return found;
  }
  walk(root, segments, 0, found);
  return found;
}

function walk(node: unknown, segments: readonly string[], from: number, found: unknown[]): void {
  let key = '';
  for (let to = from; to < segments.length; to++) {
    key = to === from ? segments[from] : `${key}.${segments[to]}`;
    if (!hasOwnKey(node, key)) continue;
    const next = (node as Record<string, unknown>)[key];
    if (to === segments.length - 1) found.push(next);
    else walk(next, segments, to + 1, found);
  }
}

function hasOwnKey(node: unknown, key: string): boolean {
  return node !== null && typeof node === 'object' && Object.hasOwn(node, key);
}
