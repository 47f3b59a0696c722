import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { openStore } from '../../../audit-wal/store.ts';
import { until } from '../../fixtures/eventually.ts';
import { freshPgDatabase } from '../../fixtures/pg-database.ts';
import { curl, startGatewayHarness, startHttps, viaGateway } from './gateway-harness.ts';

// network_flow records through the real audit path: the gateway's own WalSink (--audit-dsn,
// --audit-wal-dir) ships them to PostgreSQL as audit_events rows of kind network_flow, where the
// audit read API's filters (`proto`, `dst_host`, `outcome`) find them, as an operator reads them.

const db = await freshPgDatabase('dvx_gateway_flows');
if (!db) {
  t.comment('no PostgreSQL at 127.0.0.1:5432: the store path is not exercised here');
} else {
  t.teardown(() => db.drop());
  const wal = await mkdtemp(join(tmpdir(), 'dvx-gateway-wal-'));
  t.teardown(() => rm(wal, { recursive: true, force: true }));
  const h = await startGatewayHarness({
    audit: 'own',
    gateway: { auditDsn: db.dsn, auditWalDir: wal, denyDest: ['host=blocked.test,reason=not this one'] },
  });
  t.teardown(() => h.close());
  const dest = await startHttps(h.ca);
  t.teardown(() => dest.close());
  const store = await openStore(db.dsn);
  t.teardown(() => store.close());

  t.test('an allowed tunnel and a refusal, read back with the proto and dst_host filters', async (t) => {
    const token = await h.token();
    const ok = await curl([...viaGateway(h, token), '--cacert', h.caFile, `https://127.0.0.1:${dest.port}/`]);
    t.equal(ok.code, 0, ok.stderr);
    const denied = await curl([...viaGateway(h, token), '-w', '%{http_connect}', 'https://blocked.test/']);
    t.equal(denied.stdout, '403');
    const read = (filters: Record<string, string>) =>
      store.readEvents({ predicate: { orgs: ['org-1'] }, filters, limit: 10, offset: 0 });
    t.ok(await until(async () => (await read({ proto: 'tcp' })).length === 2, 30_000), 'both shipped');
    const [allowed] = await read({ proto: 'tcp', dst_host: '127.0.0.1' });
    t.match(allowed, {
      action: 'connect',
      actor: 'agent:agent-1',
      actor_kind: 'agent',
      agent_id: 'agent-1',
      org_id: 'org-1',
      enclave_id: 'enc-1',
      identified: true,
      proto: 'tcp',
      dst: `127.0.0.1:${dest.port}`,
      dst_host: '127.0.0.1',
      dst_ip: '127.0.0.1',
      dst_port: dest.port,
      outcome: 'allow',
      source: 'gateway',
      attrs: { status: '200', bytes_up: /^[1-9]/, bytes_down: /^[1-9]/ },
    });
    const refused = await read({ dst_host: 'blocked.test', outcome: 'deny' });
    t.equal(refused.length, 1);
    t.match(refused[0], { reason: 'not this one', dst_port: 443, attrs: { status: '403' } });
    t.same(await read({ proto: 'http' }), [], 'no http flow was made');
    t.same(
      await store.readEvents({ predicate: { orgs: ['org-2'] }, filters: { proto: 'tcp' }, limit: 10, offset: 0 }),
      [],
      'another org sees none of them',
    );
  });
}
