import { mkdtemp, readdir, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { DsnError } from '../../audit-wal/errors.ts';
import { auditCapture, openAuditReadStore, openAuditSink } from '../../audit-wal/open-sink.ts';
import { AUDIT_DEFAULTS, type AuditOptions } from '../../audit-wal/options.ts';
import { StdoutAuditSink } from '../../audit-wal/stdout-sink.ts';
import { WalSink } from '../../audit-wal/wal-sink.ts';
import { newId } from '../../core/ids.ts';
import { createLogger } from '../../core/logger.ts';
import { createRegistry } from '../../core/metrics.ts';

// The audit every server opens from its flags (audit-wal/open-sink.ts): stdout without --audit-dsn, the
// WAL shipped to the store with it, over the one store instance a component also reads; a DSN that
// names no store fails the start and leaves the WAL directory free for the next one.

const warnings: string[] = [];
const log = createLogger({ level: 'warn', destination: { write: (line: string) => void warnings.push(line) } });
const deps = (extra = {}) => ({ log, registry: createRegistry(), tables: ['audit_events'] as const, ...extra });
const flags = (o: Partial<AuditOptions>): AuditOptions => ({ ...AUDIT_DEFAULTS, ...o });

const event = (org: string) => ({
  id: newId(),
  event_time: new Date().toISOString(),
  kind: 'event',
  action: 'config.put',
  actor: 'root',
  org_id: org,
});

t.test('without --audit-dsn: stdout lines, no store, capture-or-deny off unless the sink is durable', async (t) => {
  const sink = await openAuditSink(flags({}), deps());
  t.type(sink, StdoutAuditSink);
  await sink.close();
  t.equal(await openAuditReadStore(flags({}), log), null);
  t.same(auditCapture(flags({})), { captureOrDeny: false, timeoutMs: AUDIT_DEFAULTS.auditCaptureTimeout });
  t.same(auditCapture(flags({ auditCaptureTimeout: 750 }), true), { captureOrDeny: true, timeoutMs: 750 });
});

t.test('with --audit-dsn: the WAL ships to the store the component reads, one instance', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'dvx-open-sink-'));
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  const options = flags({ auditDsn: `pglite://${join(dir, 'store')}`, auditWalDir: join(dir, 'wal') });
  const store = await openAuditReadStore(options, log);
  t.ok(store, 'a store for the read API');
  t.same(await store!.readEvents({ predicate: { orgs: ['org-o'] }, filters: {}, limit: 10, offset: 0 }), []);
  const sink = await openAuditSink(options, deps({ store }));
  t.type(sink, WalSink);
  t.ok((await readdir(join(dir, 'wal'))).includes('audit_events'), 'the WAL opens the tables it was given');
  await sink.append('audit_events', event('org-o'));
  await sink.shipped!();
  const rows = await store!.readEvents({ predicate: { orgs: ['org-o'] }, filters: {}, limit: 10, offset: 0 });
  t.equal(rows.length, 1, 'what the WAL shipped, the reader sees');
  t.same(auditCapture(options), { captureOrDeny: true, timeoutMs: AUDIT_DEFAULTS.auditCaptureTimeout });
  t.same(auditCapture({ ...options, auditCaptureOrDeny: false }, true).captureOrDeny, false, 'the flag turns it off');
  await sink.close();
  await t.rejects(
    store!.readEvents({ predicate: { orgs: ['org-o'] }, filters: {}, limit: 10, offset: 0 }),
    'the sink closed the store it was given',
  );
});

t.test('an unreachable store at start is a warning; a DSN naming no store fails and frees the WAL dir', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'dvx-open-sink-'));
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  warnings.length = 0;
  const down = await openAuditReadStore(flags({ auditDsn: 'postgres://127.0.0.1:1/none' }), log);
  t.ok(down, 'the start goes on');
  t.match(warnings.join(''), /audit store unreachable at start/);
  await down!.close();

  const wal = join(dir, 'wal');
  await t.rejects(openAuditReadStore(flags({ auditDsn: 'mysql://db/audit' }), log), DsnError);
  await t.rejects(openAuditSink(flags({ auditDsn: 'mysql://db/audit', auditWalDir: wal }), deps()), DsnError);
  await t.rejects(openAuditSink(flags({ auditDsn: 'not a url', auditWalDir: wal }), deps()), {
    message: /is not a URL/,
  });
  const sink = await openAuditSink(flags({ auditDsn: `pglite://${join(dir, 'store')}`, auditWalDir: wal }), deps());
  t.type(sink, WalSink, 'the directory is free after the failed opens');
  await sink.close();
});
