// An event stream cut into its events with their exact bytes (WHATWG HTML, "Server-sent events"): the
// tool gate (stream-gate.ts) must release an allowed event byte for byte, so unlike core/sse.ts this
// keeps each event's raw bytes — every byte from the end of the previous event to the blank line that
// ends this one, comments and odd fields included. Bytes arrive split anywhere (inside a line, between
// a CR and its LF, inside a UTF-8 sequence); lines end with LF, CRLF or CR. Where the SDKs read a
// stream more loosely than the spec (a byte-order mark on any line), the framer reads it their way.

const LF = 0x0a;
const CR = 0x0d;
const EMPTY = Buffer.alloc(0);

/** One event as it came: its bytes, and the fields a format reads from it. */
export interface SseFrame {
  /** Every byte of the event, up to and including the blank line that ended it. */
  raw: Buffer;
  /** The `event` field, when there was one. */
  event: string | null;
  /** The `data` lines joined with "\n"; null when the event had no data (a comment, a blank line). */
  data: string | null;
  /** The event's data as its format read it (JSON), kept for rendering; the format's own slot. */
  parsed: unknown;
}

export class SseFramer {
  /** Bytes received and not yet handed out in a frame: they cover [#base, #total). */
  #parts: Buffer[] = [];
  #base = 0;
  #total = 0;
  /** Where the current frame and the current line begin (absolute offsets). */
  #frameStart = 0;
  #lineStart = 0;
  /** The last chunk ended with a CR: it ended a line, and an LF first in the next chunk belongs to it. */
  #crPending = false;
  #event: string | null = null;
  #data: string[] | null = null;

  /** Bytes held for an event not yet ended. */
  get pending(): number {
    return this.#total - this.#frameStart;
  }

  /** Feeds bytes; returns the events they end. */
  push(chunk: Buffer): SseFrame[] {
    const out: SseFrame[] = [];
    if (chunk.length === 0) return out;
    const base = this.#total;
    this.#parts.push(chunk);
    this.#total += chunk.length;
    let at = 0;
    if (this.#crPending) {
      this.#crPending = false;
      at = chunk[0] === LF ? 1 : 0;
      this.#line(base - 1, base + at, out);
    }
    let cr = chunk.indexOf(CR, at);
    let lf = chunk.indexOf(LF, at);
    while (cr >= 0 || lf >= 0) {
      if (cr >= 0 && (lf < 0 || cr < lf)) {
        if (cr + 1 === chunk.length) {
          this.#crPending = true;
          break;
        }
        const next = chunk[cr + 1] === LF ? cr + 2 : cr + 1;
        this.#line(base + cr, base + next, out);
        at = next;
      } else {
        this.#line(base + lf, base + lf + 1, out);
        at = lf + 1;
      }
      if (cr >= 0 && cr < at) cr = chunk.indexOf(CR, at);
      if (lf >= 0 && lf < at) lf = chunk.indexOf(LF, at);
    }
    return out;
  }

  /** The stream ended: bytes after the last blank line, if any, as one last frame. */
  end(): SseFrame[] {
    const out: SseFrame[] = [];
    if (this.#crPending) {
      this.#crPending = false;
      this.#line(this.#total - 1, this.#total, out);
    }
    if (this.#lineStart < this.#total) this.#line(this.#total, this.#total, out);
    if (this.#frameStart < this.#total) this.#emit(this.#total, out);
    return out;
  }

  /** A line whose content ends at `contentEnd` and whose terminator ends at `next`. */
  #line(contentEnd: number, next: number, out: SseFrame[]): void {
    const start = this.#lineStart;
    this.#lineStart = next;
    let bytes = contentEnd === start ? EMPTY : this.#slice(start, contentEnd);
    // A byte-order mark opening a line is not part of it: the spec drops one only at the start of the
    // stream, but the official SDKs decode each line on its own and drop it from every line, so a
    // `<BOM>data:` line is data to them, and a line of only a BOM ends their event. The gate must read
    // at least every event they read.
    if (bytes.length >= 3 && bytes[0] === 0xef && bytes[1] === 0xbb && bytes[2] === 0xbf) bytes = bytes.subarray(3);
    if (bytes.length === 0) {
      if (next > contentEnd) this.#emit(next, out);
      return;
    }
    const line = bytes.toString('utf8');
    if (line.startsWith(':')) return;
    const colon = line.indexOf(':');
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? '' : line.slice(colon + 1);
    if (value.startsWith(' ')) value = value.slice(1);
    if (field === 'event') this.#event = value;
    else if (field === 'data') (this.#data ??= []).push(value);
  }

  #emit(end: number, out: SseFrame[]): void {
    out.push({
      raw: this.#slice(this.#frameStart, end),
      event: this.#event,
      data: this.#data?.join('\n') ?? null,
      parsed: undefined,
    });
    this.#frameStart = end;
    this.#event = null;
    this.#data = null;
    // Drop the parts wholly before the next frame.
    let drop = 0;
    while (drop < this.#parts.length && this.#base + this.#parts[drop].length <= end) {
      this.#base += this.#parts[drop].length;
      drop++;
    }
    if (drop > 0) this.#parts.splice(0, drop);
  }

  /** A copy of the bytes [from, to) of what is held (walked from the newest part: lines end near it). */
  #slice(from: number, to: number): Buffer {
    const pieces: Buffer[] = [];
    let end = this.#total;
    for (let i = this.#parts.length - 1; i >= 0 && end > from; i--) {
      const part = this.#parts[i];
      const offset = end - part.length;
      if (offset < to) pieces.push(part.subarray(Math.max(0, from - offset), Math.min(part.length, to - offset)));
      end = offset;
    }
    pieces.reverse();
    return pieces.length === 1 ? Buffer.from(pieces[0]) : Buffer.concat(pieces);
  }
}

/** The event's data as a JSON object (kept in `parsed`), or null when it is not one. */
export function objectOf(frame: SseFrame): Record<string, unknown> | null {
  if (frame.parsed !== undefined) return frame.parsed as Record<string, unknown> | null;
  let value: unknown = null;
  if (frame.data !== null) {
    try {
      value = JSON.parse(frame.data);
    } catch {
      value = null;
    }
  }
  frame.parsed = value !== null && typeof value === 'object' && !Array.isArray(value) ? value : null;
  return frame.parsed as Record<string, unknown> | null;
}
