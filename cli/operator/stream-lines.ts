import { once } from 'node:events';
import type { ActionContext } from './operator-command.ts';
import { printable, safeJson } from './output.ts';

// How a followed stream prints (`dvx audit tail`, `dvx approvals watch`): one JSON document per line
// when piped or with --output json|jsonl (a consumer reads line by line as records arrive), a compact
// human line per record on a terminal (--output table). Each write waits for a slow reader.

export async function printStreamed(
  ctx: ActionContext,
  record: Record<string, unknown>,
  compact: (r: Record<string, unknown>) => (string | undefined | null)[],
): Promise<void> {
  const line =
    ctx.settings.output === 'table'
      ? printable(
          compact(record)
            .map((c) => (c === undefined || c === null || c === '' ? '-' : c))
            .join('  '),
        )
      : safeJson(record);
  if (ctx.signal.aborted) return;
  if (!process.stdout.write(`${line}\n`))
    await Promise.race([once(process.stdout, 'drain'), once(ctx.signal, 'abort')]).catch(() => {});
}

export const str = (v: unknown): string | undefined =>
  v === undefined || v === null ? undefined : typeof v === 'string' ? v : JSON.stringify(v);
