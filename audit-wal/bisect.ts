import { StoreRejectedError } from './errors.ts';
import type { AuditTable } from './sink.ts';
import type { AuditWriter } from './store.ts';

// A batch the store rejects is split in halves and each half inserted, down to the single records it
// refuses: the good halves ship, the refused records come back with the store's own error for each.
// k bad records among n cost at most 2·k·⌈log2 n⌉ extra inserts, in ⌈log2 n⌉ rounds of halving. A
// half that went in before a later failure is inserted again on the retry: stores deduplicate by id.

export interface Refused {
  row: Record<string, unknown>;
  err: StoreRejectedError;
}

/**
 * Inserts `rows`; resolves with the records the store refuses (none when the batch went in whole).
 * Any error other than a rejection (the store went away mid-split) propagates: the caller retries.
 */
export async function insertBisecting(store: AuditWriter, table: AuditTable, rows: Record<string, unknown>[]): Promise<Refused[]> {
  const refused: Refused[] = [];
  const attempt = async (part: Record<string, unknown>[]): Promise<void> => {
    try {
      await store.insert(table, part);
    } catch (err) {
      if (!(err instanceof StoreRejectedError)) throw err;
      if (part.length === 1) {
        refused.push({ row: part[0], err });
        return;
      }
      const mid = Math.ceil(part.length / 2);
      await attempt(part.slice(0, mid));
      await attempt(part.slice(mid));
    }
  };
  if (rows.length > 0) await attempt(rows);
  return refused;
}
