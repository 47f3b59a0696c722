import type { DestinationStream } from 'pino';
import type { AuditSink, AuditTable } from './sink.ts';

// Audit on stdout, one JSON line per record, told apart from app logs by `"stream":"audit"` (spec:
// operator-api rule 6). Lines are written whole with one write each, so they never interleave.

export class StdoutAuditSink implements AuditSink {
  #out: DestinationStream | NodeJS.WritableStream;

  constructor(out: DestinationStream | NodeJS.WritableStream = process.stdout) {
    this.#out = out;
  }

  append(table: AuditTable, record: Record<string, unknown>): Promise<void> {
    // The record's own JSON with the two tags spliced in front (no spread copy of the record).
    const json = JSON.stringify(record);
    this.#out.write(
      `{"stream":"audit","table":${JSON.stringify(table)}${json.length > 2 ? ',' : ''}${json.slice(1)}\n`,
    );
    return Promise.resolve();
  }

  flush(): Promise<void> {
    const out = this.#out as NodeJS.WritableStream & { writableNeedDrain?: boolean };
    if (!out.writableNeedDrain) return Promise.resolve();
    return new Promise((resolve) => out.once('drain', () => resolve()));
  }

  close(): Promise<void> {
    return this.flush();
  }
}
