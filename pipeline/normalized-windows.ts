import { SEPARATOR } from './byte-class.ts';
import type { PatternPlan } from './inspectors/patterns.ts';
import { secretsReach } from './pattern-reach.ts';

// The normalized stage reads only around what normalization changed (docs/decisions.md, "The normalized
// stage reads around what changed"). One `…` or no-break space in a 1 MB body used to make every
// detector read the whole normalized view again, though outside the places normalization changed the
// view is the decoded view byte for byte, and the literal stage has read that already.
//
//   normalized view + its changes (normalized-view.ts) ─▶ a window around each change, reach bytes
//   and two more either side, widened to the separators around it, overlapping ones joined
//   ─▶ the windows, one 0xFF byte between each two ─▶ what every detector's normalized stage reads
//      (more than half the view, or a change not told: the whole view, as before)
//
// Why nothing is missed. A finding the normalized view makes that the decoded view does not holds a
// changed byte, or sits next to one (a changed byte is what a `\b` reads): it lies within the
// detector's reach of the change, so inside the window. The built-in detectors match within the bytes
// between two separators and never look past one (byte-ranges.ts says the same of a range's edge), and
// a window is cut only after a separator, so they read in it what they read in the whole view. A custom
// pattern or a secret matches at most `reach` bytes (pattern-reach.ts): a pattern whose matches are
// unbounded and may hold a separator (`\S{6,}`), or that reads what surrounds it (`^`, `$`, `\B`), or
// a secret too long, makes the whole view read. A match away from every change is the decoded view's,
// found by the literal stage: the same inspector and pattern fire, so the decision is the same.
//
// Why nothing is found that is not there. Each window is bytes of the view; the byte between two is
// 0xFF, which is never valid UTF-8: re2 in UTF-8 mode matches it with nothing but `\C` (a pattern holding
// one makes the whole view read), the built-in detectors stop at it as at any byte that is not ASCII,
// and a secret's folded text would need U+FFFD in it to match across (a secret holding one makes the
// whole view read). No match crosses from one window into the next, and `\b` at a window's end reads a
// separator and 0xFF, two non-word bytes, as it reads a separator and what follows it in the view at
// most one boundary less (a match missed there is away from every change).

/** The byte between two windows. */
export const JUNCTION = 0xff;

/**
 * How far (view bytes) the normalized stage must read around a change for these patterns and secrets;
 * null when the whole view must be read. A secret's folded form is matched in the view's folded text,
 * where one UTF-16 unit may stand for up to three bytes of the view (`K`, the Kelvin sign, folds to
 * `k`): three times the secrets' reach.
 */
export function windowReach(patterns: PatternPlan | null, secrets: readonly string[]): number | null {
  const reach = patterns === null ? 0 : patterns.windowReach;
  if (reach === null) return null;
  const secretReach = secretsReach(secrets);
  if (secretReach === null) return null;
  for (const s of secrets) if (s.includes('\ufffd')) return null;
  return Math.max(reach, 3 * secretReach);
}

/**
 * The windows of `view` around its `changes` (NormalizedView.changes), joined by JUNCTION; null when
 * they would cover more than half the view (read it whole), or when no change is told.
 */
export function changedWindows(view: Buffer, changes: readonly number[], reach: number): Buffer | null {
  const n = view.length;
  if (changes.length === 0) return null;
  const margin = reach + 2;
  // Flat start, end of each window; the searches for separators never walk the same bytes twice
  // (a search back stops at the window before), and stop once the windows cover half the view.
  const windows: number[] = [];
  let covered = 0;
  const half = n >> 1;
  for (let k = 0; k < changes.length; k += 4) {
    const last = windows.length - 1;
    const floor = last >= 0 ? windows[last] : 0;
    const from = Math.max(floor, changes[k] - margin);
    let start = from;
    while (start > floor && SEPARATOR[view[start - 1]] !== 1) start--;
    let end = Math.min(n, changes[k + 1] + margin);
    if (last >= 0 && end <= windows[last]) continue;
    while (end < n && (end === 0 || SEPARATOR[view[end - 1]] !== 1)) end++;
    if (last >= 0 && start <= windows[last]) {
      covered += end - windows[last];
      windows[last] = end;
    } else {
      covered += end - start;
      windows.push(start, end);
    }
    if (covered > half) return null;
  }
  const out = Buffer.allocUnsafe(covered + (windows.length >> 1) - 1);
  let p = 0;
  for (let k = 0; k < windows.length; k += 2) {
    if (k > 0) out[p++] = JUNCTION;
    p += view.copy(out, p, windows[k], windows[k + 1]);
  }
  return out;
}
