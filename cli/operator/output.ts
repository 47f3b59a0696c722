import type { OutputFormat } from './client-options.ts';

// How an operator command prints what the server answered (docs/cli.md, "Output"): a table on a
// terminal, JSON when piped or with --output json, one JSON document per line with --output jsonl.
// Everything printed came from a server, so nothing reaches the terminal raw: control, format and
// bidirectional characters are shown escaped (`\u{1b}`), in tables and in JSON alike, so an org name
// or a problem detail cannot move the cursor, rewrite the line or hide text.

// C0/C1 controls and DEL, format characters (zero-width, bidi overrides, the BOM), line and paragraph
// separators.
const UNPRINTABLE = /[\p{Cc}\p{Cf}\u2028\u2029]/gu;

/** A server's string made safe for one line of a terminal. */
export function printable(s: string): string {
  return s.replace(UNPRINTABLE, (c) => `\\u{${(c.codePointAt(0) as number).toString(16)}}`);
}

// What JSON.stringify leaves raw: it escapes C0 controls in strings itself, and the only raw C0
// characters of its output are the indentation's line breaks, which must stay.
const RAW_IN_JSON = /[\u007f-\u009f\p{Cf}\u2028\u2029]/gu;

/** JSON whose every unprintable character is a four-hex-digit `\u` escape (still valid JSON, same value). */
export function safeJson(value: unknown, indent?: number): string {
  return (JSON.stringify(value, null, indent) ?? 'null').replace(
    RAW_IN_JSON,
    // Per UTF-16 unit, so a character past U+FFFF (the tag characters) becomes its surrogate pair.
    (c) => Array.from({ length: c.length }, (_, i) => `\\u${c.charCodeAt(i).toString(16).padStart(4, '0')}`).join(''),
  );
}

export interface RenderOptions {
  /** Table columns, in order (default: every key of the rows whose value is not an object, then the others). */
  columns?: readonly string[];
  /** For a page object (`{approvals: [...], next_offset}`): the field that holds the rows to tabulate. */
  rowsField?: string;
}

const MAX_CELL = 60;

function cell(v: unknown): string {
  let s: string;
  if (v === null || v === undefined) s = '-';
  else if (typeof v === 'string') s = v;
  else if (typeof v === 'object') s = JSON.stringify(v);
  else s = String(v);
  s = printable(s);
  return s.length > MAX_CELL ? `${s.slice(0, MAX_CELL - 1)}…` : s;
}

function columnsOf(rows: Record<string, unknown>[]): string[] {
  const flat: string[] = [];
  const nested: string[] = [];
  for (const r of rows)
    for (const [k, v] of Object.entries(r)) {
      if (flat.includes(k) || nested.includes(k)) continue;
      (v !== null && typeof v === 'object' ? nested : flat).push(k);
    }
  return [...flat, ...nested];
}

function table(header: string[], rows: string[][]): string {
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i].length)));
  const line = (cells: string[]) =>
    cells
      .map((c, i) => (i === cells.length - 1 ? c : c.padEnd(widths[i])))
      .join('  ')
      .trimEnd();
  return [line(header), ...rows.map(line)].join('\n') + '\n';
}

const isRecord = (v: unknown): v is Record<string, unknown> => !!v && typeof v === 'object' && !Array.isArray(v);

/** The text a command prints for `data` in `format` ('' for nothing). */
export function render(data: unknown, format: OutputFormat, options: RenderOptions = {}): string {
  if (data === undefined) return '';
  if (format === 'json') return `${safeJson(data, 2)}\n`;
  const rowsOf = (): unknown[] | null => {
    if (Array.isArray(data)) return data;
    if (options.rowsField && isRecord(data) && Array.isArray(data[options.rowsField]))
      return data[options.rowsField] as unknown[];
    return null;
  };
  const rows = rowsOf();
  if (format === 'jsonl') return (rows ?? [data]).map((r) => `${safeJson(r)}\n`).join('');
  if (rows) {
    if (rows.length === 0) return '(none)\n';
    if (!rows.every(isRecord)) return rows.map((r) => `${cell(r)}\n`).join('');
    const cols = options.columns ? [...options.columns] : columnsOf(rows);
    let out = table(
      // Column names are the server's keys too.
      cols.map((c) => printable(c.toUpperCase())),
      rows.map((r) => cols.map((c) => cell(r[c]))),
    );
    // A page: say how to get the next one.
    if (isRecord(data) && typeof data.next_offset === 'number' && rows.length > 0)
      out += `(next page: --offset ${data.next_offset})\n`;
    return out;
  }
  if (isRecord(data)) {
    const keys = Object.keys(data);
    if (keys.length === 0) return '(empty)\n';
    return table(
      ['FIELD', 'VALUE'],
      keys.map((k) => [
        printable(k),
        typeof data[k] === 'object' && data[k] !== null ? printable(JSON.stringify(data[k])) : cell(data[k]),
      ]),
    );
  }
  return `${cell(data)}\n`;
}

/** A Problem document (or any error answer) as one line: `404 Not Found: no org acme`. */
export function problemLine(status: number, body: unknown): string {
  if (isRecord(body)) {
    const title = typeof body.title === 'string' ? body.title : typeof body.error === 'string' ? body.error : '';
    const detail =
      typeof body.detail === 'string'
        ? body.detail
        : typeof body.error_description === 'string'
          ? body.error_description
          : '';
    const text = [title, detail].filter(Boolean).join(': ');
    if (text) return printable(`${status} ${text}`.slice(0, 2000));
  }
  if (typeof body === 'string' && body.trim()) return printable(`${status} ${body.trim()}`.slice(0, 500));
  return `${status} (no problem document)`;
}
