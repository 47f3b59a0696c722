import { readdir, readFile, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { Command } from 'commander';
import { flag } from '../core/options.ts';
import { readCheckpoint } from '../audit-wal/checkpoint.ts';
import { checkHeader, decodeFrames, HEADER_BYTES } from '../audit-wal/frame.ts';
import { readDropped } from '../audit-wal/wal-table.ts';
import { DEAD_LETTER_DIR, deadLetterEntry, DeadLetterSpool, type DeadLetter } from '../audit-wal/dead-letter.ts';
import type { AuditTable } from '../audit-wal/sink.ts';
import { TABLES } from '../audit-wal/wal-sink.ts';
import { WORKER_DIR } from '../audit-wal/worker-spools.ts';
import { openStore } from '../audit-wal/store.ts';
import { DsnError, StoreUnavailableError } from '../audit-wal/errors.ts';
import { createLogger } from '../core/logger.ts';
import { CliError } from './errors.ts';
import { EXIT_BLOCKED, EXIT_OK, EXIT_UNAVAILABLE } from './exit-codes.ts';

// `dvx wal stat | tail | verify --dir DIR`: SRE tools over an audit spool (one directory per table:
// llm_audit_log, audit_events, tool_call_decisions, network_flow). They only read: a running
// component may keep appending and shipping while they look. `dvx wal dead-letter list` reads the
// dead-letter spools the same way; `dvx wal dead-letter replay` writes one, under its lock.
//
// `--workers N` spools each worker under <dir>/worker-<slot>/ (audit-wal/worker-spools.ts): pointed at
// --audit-wal-dir, every command reads the top-level spool and each worker's, and says which one
// (`spool`: "." or "worker-<slot>") wherever a record or a row could come from more than one.

const SEGMENT = /^\d{12}\.wal$/;

async function tablesIn(dir: string): Promise<string[]> {
  const found: string[] = [];
  for (const e of (await readdir(dir).catch(() => [] as string[])).sort()) {
    const files = await readdir(join(dir, e)).catch(() => [] as string[]); // a file, not a table directory
    if (files.some((f) => SEGMENT.test(f))) found.push(e);
  }
  return found;
}

interface Spool {
  /** "." for the spool at the top of --dir, "worker-<slot>" for a worker's. */
  name: string;
  dir: string;
  tables: string[];
}

/** The spools under --dir (its own tables, then each worker's), each with its tables (or only `only`). */
async function spools(dir: string, only?: string): Promise<{ list: Spool[]; workers: boolean }> {
  let entries: string[];
  try {
    entries = await readdir(dir);
  } catch (err) {
    throw new CliError(`cannot read --dir ${dir}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`);
  }
  const list: Spool[] = [{ name: '.', dir, tables: await tablesIn(dir) }];
  const workers = entries
    .map((e) => WORKER_DIR.exec(e))
    .filter((m): m is RegExpExecArray => m !== null)
    .sort((a, b) => Number(a[1]) - Number(b[1]));
  for (const m of workers) list.push({ name: m[0], dir: join(dir, m[0]), tables: await tablesIn(join(dir, m[0])) });
  for (const s of list) if (only) s.tables = s.tables.filter((t) => t === only);
  const kept = list.filter((s) => s.tables.length > 0);
  if (only && kept.length === 0) throw new CliError(`no table "${only}" under ${dir}`);
  return { list: kept, workers: kept.some((s) => s.name !== '.') };
}

async function segments(tableDir: string): Promise<number[]> {
  return (await readdir(tableDir))
    .filter((f) => SEGMENT.test(f))
    .map((f) => Number(f.slice(0, 12)))
    .sort((a, b) => a - b);
}

const segmentPath = (tableDir: string, id: number) => join(tableDir, `${String(id).padStart(12, '0')}.wal`);

/** Every frame of a table from its checkpoint on (or from the start), with any problem found. */
async function* frames(
  tableDir: string,
  fromCheckpoint: boolean,
): AsyncGenerator<{ segment: number; offset: number; payload?: Buffer; problem?: string }> {
  const checkpoint = fromCheckpoint ? await readCheckpoint(tableDir) : null;
  for (const id of await segments(tableDir)) {
    if (checkpoint && id < checkpoint.segment) continue;
    const buf = await readFile(segmentPath(tableDir, id));
    const bad = checkHeader(buf);
    if (bad) {
      yield { segment: id, offset: 0, problem: bad };
      continue;
    }
    const start = checkpoint && id === checkpoint.segment ? checkpoint.offset : HEADER_BYTES;
    const { frames: decoded, problem, validEnd } = decodeFrames(buf, start);
    for (const f of decoded) yield { segment: id, offset: f.offset, payload: f.payload };
    if (problem) yield { segment: id, offset: validEnd, problem };
  }
}

async function statCommand(opts: { dir: string }): Promise<number> {
  const out: Record<string, unknown>[] = [];
  const { list, workers } = await spools(opts.dir);
  for (const spool of list)
    for (const table of spool.tables) {
      const tableDir = join(spool.dir, table);
      const ids = await segments(tableDir);
      const checkpoint = (await readCheckpoint(tableDir)) ?? { segment: ids[0], offset: HEADER_BYTES };
      let unshipped = 0;
      for (const id of ids) {
        if (id < checkpoint.segment) continue;
        const size = (await stat(segmentPath(tableDir, id))).size;
        unshipped += id === checkpoint.segment ? size - checkpoint.offset : size - HEADER_BYTES;
      }
      let oldest: string | null = null;
      for await (const f of frames(tableDir, true)) {
        if (f.payload) {
          try {
            oldest = String((JSON.parse(f.payload.toString()) as { event_time?: unknown }).event_time ?? '') || null;
          } catch {
            oldest = null; // a damaged record: `verify` reports it, `stat` shows no date
          }
        }
        break;
      }
      const ageS = oldest ? Math.max(0, (Date.now() - Date.parse(oldest)) / 1000) : 0;
      let deadLetter = 0;
      if ((await readdir(tableDir)).includes(DEAD_LETTER_DIR))
        for await (const f of frames(join(tableDir, DEAD_LETTER_DIR), true)) if (f.payload) deadLetter++;
      out.push({
        ...(workers ? { spool: spool.name } : {}),
        table,
        segments: ids.length,
        unshipped_bytes: Math.max(0, unshipped),
        oldest_unshipped_age_s: Math.round(ageS * 10) / 10,
        dropped: await readDropped(tableDir),
        dead_letter: deadLetter,
        checkpoint,
      });
    }
  process.stdout.write(out.map((r) => JSON.stringify(r)).join('\n') + (out.length ? '\n' : ''));
  return EXIT_OK;
}

async function tailCommand(opts: { dir: string; table?: string; follow?: boolean; all?: boolean }): Promise<number> {
  const { list, workers } = await spools(opts.dir, opts.table);
  const sources = list.flatMap((spool) => spool.tables.map((table) => ({ spool, table })));
  // One table of one spool prints its records as they are; more are wrapped to say where each is from.
  const wrap = sources.length > 1;
  const seen = new Map<string, { segment: number; offset: number }>();
  const emit = async () => {
    for (const { spool, table } of sources) {
      const tableDir = join(spool.dir, table);
      const key = `${spool.name}/${table}`;
      const last = seen.get(key);
      for await (const f of frames(tableDir, !opts.all && !last)) {
        if (!f.payload) continue;
        if (last && (f.segment < last.segment || (f.segment === last.segment && f.offset <= last.offset))) continue;
        const where = workers ? `"spool":${JSON.stringify(spool.name)},` : '';
        process.stdout.write(
          wrap
            ? `{${where}"table":${JSON.stringify(table)},"record":${f.payload.toString()}}\n`
            : f.payload.toString() + '\n',
        );
        seen.set(key, { segment: f.segment, offset: f.offset });
      }
      if (!seen.has(key)) seen.set(key, { segment: 0, offset: 0 });
    }
  };
  await emit();
  if (!opts.follow) return EXIT_OK;
  for (;;) {
    await new Promise((r) => setTimeout(r, 250));
    await emit();
  }
}

async function verifyCommand(opts: { dir: string }): Promise<number> {
  let problems = 0;
  let records = 0;
  const { list, workers } = await spools(opts.dir);
  for (const spool of list)
    for (const table of spool.tables) {
      for await (const f of frames(join(spool.dir, table), false)) {
        if (f.payload) records++;
        else {
          problems++;
          const where = workers ? { spool: spool.name } : {};
          process.stdout.write(
            JSON.stringify({ ...where, table, segment: f.segment, offset: f.offset, problem: f.problem }) + '\n',
          );
        }
      }
    }
  process.stderr.write(`dvx wal verify: ${records} records, ${problems} problem(s)\n`);
  return problems > 0 ? EXIT_BLOCKED : EXIT_OK;
}

/** Tables that have a dead-letter spool, in every spool under --dir. */
async function deadLetterTables(
  dir: string,
  only?: string,
): Promise<{ spool: Spool; table: string; workers: boolean }[]> {
  const found: { spool: Spool; table: string; workers: boolean }[] = [];
  const { list, workers } = await spools(dir, only);
  for (const spool of list)
    for (const table of spool.tables) {
      const files = await readdir(join(spool.dir, table)).catch(() => [] as string[]); // gone since listed: no spool
      if (files.includes(DEAD_LETTER_DIR)) found.push({ spool, table, workers });
    }
  return found;
}

/** A terminal table: fixed columns, the last one cut to the terminal's width. */
function renderTable(header: string[], rows: string[][], width: number): string {
  const cut = (s: string, n: number) => (s.length > n ? `${s.slice(0, Math.max(0, n - 1))}…` : s);
  // A record is an agent's data and a store's error may quote it: no control character reaches the terminal.
  const plain = (c: string) =>
    c
      .replace(/\s+/g, ' ')
      .replace(/[\u0000-\u001f\u007f-\u009f]/g, (ch) => `\\u${ch.charCodeAt(0).toString(16).padStart(4, '0')}`);
  rows = rows.map((r) => r.map(plain));
  const widths = header.map((h, i) =>
    Math.min(i === header.length - 1 ? Infinity : 60, Math.max(h.length, ...rows.map((r) => r[i].length))),
  );
  const fixed = widths.slice(0, -1).reduce((a, b) => a + b + 2, 0);
  widths[widths.length - 1] = Math.max(20, Math.min(widths.at(-1)!, width - fixed));
  return (
    [header, ...rows]
      .map((r) =>
        r
          .map((c, i) => cut(c, widths[i]).padEnd(widths[i]))
          .join('  ')
          .trimEnd(),
      )
      .join('\n') + '\n'
  );
}

async function deadLetterListCommand(opts: { dir: string; table?: string }): Promise<number> {
  const entries: (DeadLetter & { spool?: string })[] = [];
  for (const { spool, table, workers } of await deadLetterTables(opts.dir, opts.table)) {
    for await (const f of frames(join(spool.dir, table, DEAD_LETTER_DIR), true)) {
      if (f.payload) entries.push({ ...(workers ? { spool: spool.name } : {}), ...deadLetterEntry(table, f.payload) });
      else
        process.stderr.write(
          `dvx wal dead-letter list: ${join(spool.name, table, DEAD_LETTER_DIR)} segment ${f.segment} offset ${f.offset}: ${f.problem}\n`,
        );
    }
  }
  if (!process.stdout.isTTY) {
    // Piped: JSON lines, one entry each, like `dvx wal tail`.
    process.stdout.write(entries.map((e) => JSON.stringify(e) + '\n').join(''));
    return EXIT_OK;
  }
  if (entries.length === 0) {
    process.stdout.write('no dead-lettered records\n');
    return EXIT_OK;
  }
  const rows = entries.map((e) => [
    e.id ?? '-',
    e.spool ? `${e.spool}/${e.table}` : e.table,
    e.dead_lettered_at,
    e.error.store_code ?? e.reason,
    e.error.message,
    e.record ? JSON.stringify(e.record) : (e.raw ?? ''),
  ]);
  process.stdout.write(
    renderTable(['ID', 'TABLE', 'WHEN', 'CODE', 'ERROR', 'RECORD'], rows, process.stdout.columns ?? 160),
  );
  return EXIT_OK;
}

async function deadLetterReplayCommand(opts: { dir: string; table?: string; auditDsn: string }): Promise<number> {
  const found = await deadLetterTables(opts.dir, opts.table);
  const names = [...new Set(found.map((f) => f.table))];
  // Only a table the stores know is replayed into (its name goes into the INSERT).
  const unknown = names.filter((n) => !(TABLES as readonly string[]).includes(n));
  if (unknown.length > 0)
    throw new CliError(`not an audit table: ${unknown.join(', ')} (the tables are ${TABLES.join(', ')})`);
  let store;
  try {
    store = await openStore(opts.auditDsn);
  } catch (err) {
    if (err instanceof DsnError) throw new CliError(err.message);
    throw err;
  }
  const log = createLogger({ level: 'warn', destination: process.stderr as never });
  let kept = 0;
  try {
    try {
      await store.ensureSchema();
    } catch (err) {
      throw new CliError(`audit store unavailable: ${(err as Error).message}`, EXIT_UNAVAILABLE);
    }
    for (const { spool: where, table, workers } of found) {
      const spool = new DeadLetterSpool(join(where.dir, table), table as AuditTable, { log });
      const tag = workers ? { spool: where.name } : {};
      let result;
      try {
        result = await spool.replay(store);
      } catch (err) {
        if (err instanceof StoreUnavailableError)
          throw new CliError(
            `audit store unavailable, nothing replayed for ${table}: ${err.message}`,
            EXIT_UNAVAILABLE,
          );
        throw err;
      }
      kept += result.kept.length;
      for (const e of result.shipped)
        process.stdout.write(JSON.stringify({ ...tag, table, id: e.id, replay: 'shipped' }) + '\n');
      for (const e of result.kept)
        process.stdout.write(JSON.stringify({ ...tag, table, id: e.id, replay: 'kept', error: e.error }) + '\n');
      process.stderr.write(
        `dvx wal dead-letter replay: ${workers ? `${where.name}/` : ''}${table}: ${result.shipped.length} shipped, ${result.kept.length} kept\n`,
      );
    }
  } finally {
    await store.close();
  }
  return kept > 0 ? EXIT_BLOCKED : EXIT_OK;
}

export function walCommand(): Command {
  const wal = new Command('wal').description(
    'inspect an audit spool (--audit-wal-dir; with --workers, every worker-<slot> spool under it too)',
  );
  const dir = () =>
    flag('--dir <dir>', { description: 'the audit WAL directory (--audit-wal-dir)' }).makeOptionMandatory();
  wal
    .command('stat')
    .description(
      'per table: segments, unshipped bytes, oldest unshipped age, dropped count, dead-lettered records, checkpoint',
    )
    .addOption(dir())
    .action(async (o) => void (process.exitCode = await statCommand(o)));
  wal
    .command('tail')
    .description('records as JSON lines (unshipped ones unless --all)')
    .addOption(dir())
    .addOption(flag('--table <name>', { description: 'only this table' }))
    .option('--all', 'from the first retained record, shipped or not')
    .option('--follow', 'keep printing new records as they are appended')
    .action(async (o) => void (process.exitCode = await tailCommand(o)));
  wal
    .command('verify')
    .description('check every frame; exit 1 with the offsets of corruption')
    .addOption(dir())
    .action(async (o) => void (process.exitCode = await verifyCommand(o)));
  const dead = wal
    .command('dead-letter')
    .description('records the store rejected, kept aside under <dir>/<table>/dead-letter');
  dead
    .command('list')
    .description(
      "dead-lettered records (id, table, when, the store's error, the record): a table on a terminal, JSON lines when piped",
    )
    .addOption(dir())
    .addOption(flag('--table <name>', { description: 'only this table' }))
    .action(async (o) => void (process.exitCode = await deadLetterListCommand(o)));
  dead
    .command('replay')
    .description(
      'insert the dead-lettered records again as they are; those the store takes leave the spool (exit 1 when some stay)',
    )
    .addOption(dir())
    .addOption(flag('--table <name>', { description: 'only this table' }))
    .addOption(
      flag('--audit-dsn <dsn>', {
        description: 'the audit store to replay into: clickhouse://…, postgres://…, pglite://DIR',
      }).makeOptionMandatory(),
    )
    .action(async (o) => void (process.exitCode = await deadLetterReplayCommand(o)));
  return wal;
}
