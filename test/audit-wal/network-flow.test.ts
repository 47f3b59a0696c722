import t, { type Test } from 'tap';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { PassThrough } from 'node:stream';
import { createClient } from '@clickhouse/client';
import { createLogger } from '../../core/logger.ts';
import { createRegistry } from '../../core/metrics.ts';
import { newId } from '../../core/ids.ts';
import { WalSink } from '../../audit-wal/wal-sink.ts';
import { StdoutAuditSink } from '../../audit-wal/stdout-sink.ts';
import { openStore, type AuditStore } from '../../audit-wal/store.ts';
import { until } from '../fixtures/eventually.ts';

// The gateway's network_flow spool: its own WAL table, shipped into the stores' audit_events as rows of
// kind network_flow (whatever kind the record claims), where the audit read filters proto and dst_host
// find them; on stdout, lines of table network_flow.

const dirs: string[] = [];
t.teardown(() => Promise.all(dirs.map((d) => rm(d, { recursive: true, force: true }))));
const tempDir = async () => {
  const d = await mkdtemp(join(tmpdir(), 'dvx-flow-'));
  dirs.push(d);
  return d;
};
const quiet = createLogger({ level: 'error', destination: { write: () => {} } });

const flow = (host: string, extra: Record<string, unknown> = {}) => ({
  id: newId(),
  event_time: new Date().toISOString(),
  action: 'connect',
  actor: 'agent:a-1',
  agent_id: 'a-1',
  org_id: 'org-1',
  proto: 'tcp',
  src: '127.0.0.1:5000',
  src_ip: '127.0.0.1',
  dst: `${host}:443`,
  dst_host: host,
  dst_ip: '192.0.2.7',
  dst_port: 443,
  outcome: 'allow',
  reason: '',
  identified: true,
  source: 'gateway',
  attrs: { bytes_up: '10', bytes_down: '20', duration_ms: '3' },
  ...extra,
});

async function shipAndRead(t: Test, dsn: string): Promise<void> {
  const sink = await WalSink.open({
    dir: await tempDir(),
    dsn,
    log: quiet,
    registry: createRegistry(),
    shipper: { idleMs: 50 },
  });
  await sink.append('network_flow', flow('api.example.com'));
  // A record that claims another kind is still a flow: the spool decides, not the producer.
  await sink.append('network_flow', flow('other.example.com', { kind: 'event', proto: 'https', outcome: 'deny' }));
  await sink.append('audit_events', {
    id: newId(),
    event_time: new Date().toISOString(),
    action: 'x',
    org_id: 'org-1',
  });
  t.ok(
    await until(
      () =>
        sink.table('network_flow')!.stats().unshippedBytes === 0 &&
        sink.table('audit_events')!.stats().unshippedBytes === 0,
    ),
    'shipped',
  );
  await sink.close();
  const store: AuditStore = await openStore(dsn);
  t.teardown(() => store.close());
  const read = (filters: Record<string, string>) =>
    store.readEvents({ predicate: { orgs: ['org-1'] }, filters, limit: 100, offset: 0 });
  const byHost = await read({ dst_host: 'api.example.com' });
  t.equal(byHost.length, 1, 'dst_host finds the flow');
  t.match(byHost[0], { proto: 'tcp', dst_port: 443, outcome: 'allow', actor: 'agent:a-1', source: 'gateway' });
  t.match(byHost[0].attrs, { bytes_up: '10', bytes_down: '20' });
  const https = await read({ proto: 'https' });
  t.same(
    https.map((r) => r.dst_host),
    ['other.example.com'],
    'proto finds the flow that claimed another kind',
  );
  t.equal((await read({})).length, 3, 'the operator event is there too, unfiltered');
}

t.test('PGlite: network_flow records are audit events of kind network_flow', async (t) => {
  await shipAndRead(t, `pglite://${await tempDir()}`);
});

t.test('ClickHouse: the same', async (t) => {
  const admin = createClient({ url: 'http://127.0.0.1:8123' });
  try {
    await admin.ping();
  } catch {
    await admin.close();
    t.plan(0, 'ClickHouse not reachable');
    return;
  }
  const db = `dvx_flow_${Date.now().toString(36)}`;
  t.teardown(async () => {
    await admin.command({ query: `DROP DATABASE IF EXISTS ${db}` });
    await admin.close();
  });
  await shipAndRead(t, `clickhouse://default@127.0.0.1:8123/${db}`);
});

t.test('stdout: one line per flow, table network_flow', async (t) => {
  const out = new PassThrough();
  const lines: string[] = [];
  out.on('data', (c: Buffer) => lines.push(...c.toString().split('\n').filter(Boolean)));
  const sink = new StdoutAuditSink(out);
  await sink.append('network_flow', flow('api.example.com'));
  await sink.flush();
  t.equal(lines.length, 1);
  t.match(JSON.parse(lines[0]), { stream: 'audit', table: 'network_flow', dst_host: 'api.example.com', proto: 'tcp' });
});
