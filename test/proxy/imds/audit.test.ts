import t from 'tap';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { WalTable } from '../../../audit-wal/wal-table.ts';
import type { AuditSink, AuditTable } from '../../../audit-wal/sink.ts';
import { until } from '../../fixtures/eventually.ts';
import { get, GH_TOKEN, startHarness } from './imds-fixture.ts';

// Handing out a credential is an authority-gated effect (spec: "Audit durability flags"): its
// `credential.read` record goes to the sink first, and with a durable sink the value leaves only once
// the record is durable; a record not durable within --audit-capture-timeout refuses the value (503).

t.test('a stdout record of every credential read, naming the secret, never its value', async (t) => {
  const h = await startHarness(t);
  t.equal((await get(h.socket, '/v1/credentials/gh_token')).status, 200);
  t.equal((await get(h.socket, '/v1/credentials/db_password')).status, 404);
  t.equal((await get(h.socket, '/v1/credentials')).status, 200);
  t.equal((await get(h.socket, '/v1/config')).status, 200);
  t.equal(h.audit.length, 2, 'one record per credential read (the lists and the config are not credentials)');
  t.match(h.audit[0], {
    stream: 'audit',
    table: 'audit_events',
    kind: 'event',
    action: 'credential.read',
    actor: 'agent:agent-1',
    actor_kind: 'agent',
    agent_id: 'agent-1',
    org_id: 'org-1',
    group_id: 'ops',
    enclave_id: 'enc-1',
    enclave_name: 'eu-prod',
    outcome: 'allow',
    resource: 'secret:gh_token',
    scope: 'org:org-1',
    source: 'imds',
    attrs: { secret: 'gh_token', header: 'authorization', hosts: 'api.github.com,*.github.com' },
  });
  t.match(h.audit[1], {
    action: 'credential.read',
    outcome: 'deny',
    resource: 'secret:db_password',
    reason: /secret "db_password"/,
    attrs: { secret: 'db_password' },
  });
  t.notOk(JSON.stringify(h.audit).includes(GH_TOKEN), 'no value in an audit record');
});

/** A durable sink whose appends resolve only when the test releases them. */
function heldSink() {
  const held: { record: Record<string, unknown>; release: () => void }[] = [];
  const sink: AuditSink = {
    append: (_table: AuditTable, record: Record<string, unknown>) =>
      new Promise<void>((resolve) => held.push({ record, release: resolve })),
    flush: async () => {},
    close: async () => {},
  };
  return { sink, held };
}

t.test('with a durable sink the value waits for its record', async (t) => {
  const { sink, held } = heldSink();
  const h = await startHarness(t, {}, { audit: sink, durableAudit: true });
  let answered = false;
  const reply = get(h.socket, '/v1/credentials/gh_token').then((r) => {
    answered = true;
    return r;
  });
  t.ok(await until(() => held.length === 1, 10_000), 'the record is appended');
  t.match(held[0]!.record, { action: 'credential.read', outcome: 'allow', resource: 'secret:gh_token' });
  // The append has not resolved: nothing has been sent. (The answer could only come from the effect,
  // which gated() runs after the append resolves.)
  await new Promise((r) => setImmediate(r));
  t.notOk(answered, 'no answer while the record is not durable');
  held[0]!.release();
  const res = await reply;
  t.equal(res.status, 200);
  t.equal(res.json.value, `token ${GH_TOKEN}`);
});

t.test('a record that never becomes durable refuses the value: 503, nothing of the secret', async (t) => {
  const never: AuditSink = { append: () => new Promise<void>(() => {}), flush: async () => {}, close: async () => {} };
  const h = await startHarness(t, { auditCaptureTimeout: 200 }, { audit: never, durableAudit: true });
  const res = await get(h.socket, '/v1/credentials/gh_token');
  t.equal(res.status, 503);
  t.same(res.json, {
    type: 'error',
    error: { type: 'audit_unavailable', message: 'Request rejected: the audit record could not be made durable.' },
  });
  t.notOk(res.text.includes(GH_TOKEN));
  t.ok(
    h.logs.some((l) => l.includes('audit capture failed: effect refused')),
    'logged',
  );

  // --no-audit-capture-or-deny: the value is sent beside its record.
  const off = await startHarness(
    t,
    { auditCaptureTimeout: 200, auditCaptureOrDeny: false },
    { audit: never, durableAudit: true },
  );
  t.equal((await get(off.socket, '/v1/credentials/gh_token')).status, 200);
});

t.test('--audit-dsn: the record goes to the WAL of audit_events', async (t) => {
  const walDir = await mkdtemp(join(tmpdir(), 'dvx-imds-wal-'));
  t.teardown(() => rm(walDir, { recursive: true, force: true }));
  // A store that is never reachable keeps every record in the WAL, where the test can read it.
  const h = await startHarness(
    t,
    { auditDsn: 'postgres://nobody@127.0.0.1:1/none', auditWalDir: walDir },
    { audit: undefined },
  );
  t.equal((await get(h.socket, '/v1/credentials/org_token')).status, 200);
  await h.close();
  const table = await WalTable.open(join(walDir, 'audit_events'), 'audit_events');
  t.teardown(() => table.close());
  const { records } = await table.read(table.checkpoint, 10);
  t.equal(records.length, 1);
  t.match(JSON.parse(records[0]!.payload.toString()), {
    action: 'credential.read',
    resource: 'secret:org_token',
    source: 'imds',
  });
});
