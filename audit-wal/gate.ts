import type { Logger } from '../core/logger.ts';
import { AuditUnavailableError } from './errors.ts';
import type { AuditSink, AuditTable } from './sink.ts';

// Capture-or-deny (spec: "Audit durability flags"): an authority-gated effect runs only once its audit
// record is durable. The effect is a callback this function calls after the append resolved, so no
// caller can apply it first. Past the timeout, or when the record is dropped or cannot be written, the
// effect is refused: AuditUnavailableError, and the effect never runs.
//
// With capture-or-deny off, the effect runs at once and the record is appended beside it; a failure
// to record is logged, not enforced.

export interface CaptureOptions {
  captureOrDeny: boolean;
  timeoutMs: number;
  log?: Logger;
}

export const DEFAULT_CAPTURE_TIMEOUT_MS = 5000;

export async function gated<T>(
  sink: AuditSink,
  table: AuditTable,
  record: Record<string, unknown>,
  effect: () => T | Promise<T>,
  options: CaptureOptions,
): Promise<T> {
  if (!options.captureOrDeny) {
    sink.append(table, record).catch((err: unknown) => {
      options.log?.error({ err, table, id: record.id }, 'audit record lost (capture-or-deny off)');
    });
    return effect();
  }
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(
      () => reject(new AuditUnavailableError(`audit record not durable within ${options.timeoutMs} ms`)),
      options.timeoutMs,
    );
  });
  try {
    await Promise.race([sink.append(table, record), timeout]);
  } catch (err) {
    options.log?.error({ err, table, id: record.id }, 'audit capture failed: effect refused');
    if (err instanceof AuditUnavailableError) throw err;
    throw new AuditUnavailableError(`audit record could not be made durable: ${(err as Error).message}`, {
      cause: err,
    });
  } finally {
    clearTimeout(timer);
  }
  return effect();
}
