import { StoreRefusesAllError, StoreRejectedError } from './errors.ts';
import type { AuditTable } from './sink.ts';
import type { AuditWriter } from './store.ts';

// A batch the store rejects is split in halves and each half inserted, down to the single records it
// refuses: the good halves ship, the refused records come back with the store's own error for each.
// k bad records among n cost at most 2·k·⌈log2 n⌉ extra inserts, in ⌈log2 n⌉ rounds of halving. A
// half that went in before a later failure is inserted again on the retry: stores deduplicate by id.
//
// A store that refuses everything (an operator changed a column's type, so every insert fails with a
// data error) would otherwise have the whole WAL dead-lettered at full speed. So before a batch of at
// least `probe` records that the store rejects whole is split, it is probed with that many of its
// records spread evenly over it, one by one: none taken suggests the store changed, not the records.
// The conclusion is StoreRefusesAllError, an unavailability: the shipper backs off and retries, the
// records wait in the WAL. The probe costs at most `probe` inserts, where bisecting a batch refused
// whole costs 2·len. Only the batch's own records are offered: re-inserting one the store took before
// would bring back a row erasure has since removed. The records being an agent's, a batch can be made
// to fail every probe; the shipper therefore probes a batch a bounded number of times (shipper.ts).

export interface Refused {
  row: Record<string, unknown>;
  err: StoreRejectedError;
}

/**
 * Inserts `rows`; resolves with the records the store refuses (none when the batch went in whole).
 * Any error other than a rejection (the store went away mid-split) propagates: the caller retries.
 */
export async function insertBisecting(
  store: AuditWriter,
  table: AuditTable,
  rows: Record<string, unknown>[],
  options: { probe?: number } = {},
): Promise<Refused[]> {
  const refused: Refused[] = [];
  const probe = options.probe ?? 0;
  const storeRefusesAll = async (): Promise<boolean> =>
    probe > 0 && rows.length >= probe && !(await takesAny(store, table, rows, probe));
  const attempt = async (part: Record<string, unknown>[]): Promise<void> => {
    try {
      await store.insert(table, part);
    } catch (err) {
      if (!(err instanceof StoreRejectedError)) throw err;
      if (part === rows && (await storeRefusesAll())) {
        throw new StoreRefusesAllError(
          `${store.kind} refused a batch of ${rows.length} and all ${probe} records probed one by one: suspected a store or schema problem, not the records; retrying`,
          err.storeCode,
          err,
        );
      }
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

/** Whether the store takes any of `n` records spread evenly over `rows` (the first and the last among them). */
async function takesAny(
  store: AuditWriter,
  table: AuditTable,
  rows: Record<string, unknown>[],
  n: number,
): Promise<boolean> {
  const picks = new Set(Array.from({ length: n }, (_, i) => Math.round((i * (rows.length - 1)) / Math.max(1, n - 1))));
  for (const i of picks) {
    try {
      await store.insert(table, [rows[i]]);
      return true;
    } catch (err) {
      if (!(err instanceof StoreRejectedError)) throw err;
    }
  }
  return false;
}
