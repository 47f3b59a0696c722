import t from 'tap';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { gated } from '../../audit-wal/gate.ts';
import { AuditUnavailableError } from '../../audit-wal/errors.ts';
import { WalTable } from '../../audit-wal/wal-table.ts';
import type { AuditSink } from '../../audit-wal/sink.ts';

// capture-or-deny over a real WAL: the effect runs only after the record is durable, and never when
// it is dropped, fails, or takes longer than the timeout.

const dir = await mkdtemp(join(tmpdir(), 'dvx-gate-'));
t.teardown(() => rm(dir, { recursive: true, force: true }));
const walSink = (table: WalTable): AuditSink => ({
  append: (_t, r) => table.append(r),
  flush: async () => {},
  close: () => table.close(),
});

t.test('the effect runs after the record is durable', async (t) => {
  const table = await WalTable.open(join(dir, 'a'), 'a');
  t.teardown(() => table.close());
  const result = await gated(
    walSink(table),
    'audit_events',
    { id: 'r1' },
    async () => {
      const { records } = await table.read(table.checkpoint, 10);
      return records.length;
    },
    { captureOrDeny: true, timeoutMs: 5000 },
  );
  t.equal(result, 1, 'the record was already in the WAL when the effect ran');
});

t.test('a record dropped at the ceiling refuses the effect', async (t) => {
  const table = await WalTable.open(join(dir, 'b'), 'b', { maxBytes: 64 });
  t.teardown(() => table.close());
  let ran = false;
  await t.rejects(
    gated(
      walSink(table),
      'audit_events',
      { id: 'r', pad: 'x'.repeat(200) },
      () => {
        ran = true;
      },
      { captureOrDeny: true, timeoutMs: 5000 },
    ),
    AuditUnavailableError,
  );
  t.notOk(ran, 'nothing of the effect happened');
});

t.test('a write that fails or stalls past the timeout refuses the effect', async (t) => {
  let ran = false;
  const failing: AuditSink = {
    append: () => Promise.reject(new Error('EIO')),
    flush: async () => {},
    close: async () => {},
  };
  await t.rejects(
    gated(failing, 'audit_events', { id: 'r' }, () => (ran = true), { captureOrDeny: true, timeoutMs: 1000 }),
    /could not be made durable: EIO/,
  );
  const stalled: AuditSink = { append: () => new Promise(() => {}), flush: async () => {}, close: async () => {} };
  const started = Date.now();
  await t.rejects(
    gated(stalled, 'audit_events', { id: 'r' }, () => (ran = true), { captureOrDeny: true, timeoutMs: 150 }),
    /not durable within 150 ms/,
  );
  t.ok(Date.now() - started < 1000);
  t.notOk(ran);
});

t.test('capture-or-deny off: the effect runs whatever the record does', async (t) => {
  const failing: AuditSink = {
    append: () => Promise.reject(new Error('EIO')),
    flush: async () => {},
    close: async () => {},
  };
  t.equal(
    await gated(failing, 'audit_events', { id: 'r' }, () => 'done', { captureOrDeny: false, timeoutMs: 10 }),
    'done',
  );
});
