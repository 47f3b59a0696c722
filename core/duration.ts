// Go-style durations ("2s", "500ms", "1m30s", "5m") as used by every --*-timeout flag (spec: Limits).
const UNIT_MS: Record<string, number> = { ns: 1e-6, us: 1e-3, µs: 1e-3, ms: 1, s: 1000, m: 60_000, h: 3_600_000 };
const PART = /(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)/y;

/** Parses a duration into milliseconds; a bare integer is read as milliseconds. Throws on anything else. */
export function parseDuration(text: string): number {
  const input = text.trim();
  if (/^\d+$/.test(input)) return Number(input);
  if (input === '') throw new TypeError(`invalid duration ""`);
  let total = 0;
  PART.lastIndex = 0;
  let at = 0;
  while (at < input.length) {
    PART.lastIndex = at;
    const m = PART.exec(input);
    if (m === null) throw new TypeError(`invalid duration "${text}" (expected e.g. 500ms, 2s, 1m30s)`);
    total += Number(m[1]) * UNIT_MS[m[2]];
    at = PART.lastIndex;
  }
  return total;
}
