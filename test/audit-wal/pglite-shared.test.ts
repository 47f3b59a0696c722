import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { PostgresStore } from '../../audit-wal/stores/postgres.ts';

// Two stores on one PGlite directory in one process (dvx dev's broker, llmproxy and gateway over the
// enclave's store) share one database: what one writes the other reads, and closing one leaves the
// other working until the last close.

const dir = await mkdtemp(join(tmpdir(), 'dvx-pglite-shared-'));
t.teardown(() => rm(dir, { recursive: true, force: true }));

const row = (id: string) => ({
  id,
  event_time: new Date().toISOString(),
  org_id: 'org-a',
  scope: 'org',
  actor: 'user:alice',
  actor_kind: 'human-operator',
  action: 'org.update',
  outcome: 'success',
  target: 'org:org-a',
  trace_id: 't',
  details: {},
});

t.test('one database behind two openers; the last close closes it', async (t) => {
  const a = PostgresStore.embedded(join(dir, 'enclave'));
  const b = PostgresStore.embedded(join(dir, 'x', '..', 'enclave'));
  await a.ensureSchema();
  await b.ensureSchema();
  await a.insert('audit_events', [row('r1')]);
  await b.insert('audit_events', [row('r2')]);
  const q = { predicate: { orgs: ['org-a'] }, filters: {}, limit: 10, offset: 0 };
  t.same((await b.readEvents(q)).map((r) => r.id).sort(), ['r1', 'r2']);
  await a.close();
  await a.close();
  t.same((await b.readEvents(q)).map((r) => r.id).sort(), ['r1', 'r2'], 'a double close takes one reference only');
  await b.close();
  const c = PostgresStore.embedded(join(dir, 'enclave'));
  t.same((await c.readEvents(q)).map((r) => r.id).sort(), ['r1', 'r2'], 'reopened from disk');
  await c.close();
});
