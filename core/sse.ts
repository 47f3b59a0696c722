// Server-sent events (WHATWG HTML, "Server-sent events"): an incremental parser that takes bytes as
// they arrive and yields whole events, and a writer. Used where streams are translated.

export interface SseEvent {
  event: string | null;
  data: string;
  /** The event's `id` field, when it carried one (the resume cursor, Last-Event-ID). */
  id?: string;
}

export class SseParser {
  #buffer = '';
  #decoder = new TextDecoder('utf-8');
  #event: string | null = null;
  #data: string[] = [];
  #id: string | null = null;

  /** Feeds bytes; returns the events they complete. */
  push(chunk: Uint8Array): SseEvent[] {
    this.#buffer += this.#decoder.decode(chunk, { stream: true });
    return this.#drain(false);
  }

  /** The stream ended: returns a last event not followed by a blank line, if any. */
  end(): SseEvent[] {
    this.#buffer += this.#decoder.decode();
    const out = this.#drain(true);
    if (this.#data.length > 0) out.push(this.#flush());
    return out;
  }

  #flush(): SseEvent {
    const e: SseEvent = { event: this.#event, data: this.#data.join('\n') };
    if (this.#id !== null) e.id = this.#id;
    this.#event = null;
    this.#id = null;
    this.#data = [];
    return e;
  }

  #drain(final: boolean): SseEvent[] {
    const out: SseEvent[] = [];
    for (;;) {
      const nl = this.#buffer.search(/\r\n|\r|\n/);
      if (nl < 0) {
        if (final && this.#buffer.length > 0) {
          this.#line(this.#buffer, out);
          this.#buffer = '';
        }
        return out;
      }
      const line = this.#buffer.slice(0, nl);
      const width = this.#buffer.startsWith('\r\n', nl) ? 2 : 1;
      if (this.#buffer[nl] === '\r' && nl + 1 === this.#buffer.length && !final) return out; // maybe \r\n split
      this.#buffer = this.#buffer.slice(nl + width);
      this.#line(line, out);
    }
  }

  #line(line: string, out: SseEvent[]): void {
    if (line === '') {
      if (this.#data.length > 0 || this.#event !== null) out.push(this.#flush());
      return;
    }
    if (line.startsWith(':')) return;
    const colon = line.indexOf(':');
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? '' : line.slice(colon + 1);
    if (value.startsWith(' ')) value = value.slice(1);
    if (field === 'event') this.#event = value;
    else if (field === 'data') this.#data.push(value);
    else if (field === 'id' && !value.includes('\0')) this.#id = value;
  }
}

/** Starts an SSE response on a raw node response: headers, and a reconnection delay for the client. */
export function startSseResponse(
  res: { writeHead(status: number, headers: Record<string, string>): unknown; write(chunk: string): unknown },
  retryMs = 2000,
): void {
  res.writeHead(200, {
    'content-type': 'text/event-stream',
    'cache-control': 'no-store',
    connection: 'keep-alive',
    'x-accel-buffering': 'no',
  });
  res.write(`retry: ${retryMs}\n\n`);
}

export function formatSse(event: string | null, data: unknown, id?: string | number): string {
  const payload = typeof data === 'string' ? data : JSON.stringify(data);
  return `${id !== undefined ? `id: ${id}\n` : ''}${event ? `event: ${event}\n` : ''}data: ${payload}\n\n`;
}
