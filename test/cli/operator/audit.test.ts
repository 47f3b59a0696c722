import { type ChildProcessWithoutNullStreams, spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import t from 'tap';
import { startBrokerHarness } from '../../fixtures/broker-harness.ts';
import { startCpHarness } from '../../fixtures/controlplane-harness.ts';
import { freshPgDatabase } from '../../fixtures/pg-database.ts';
import { DVX_BIN } from '../../fixtures/run-dvx.ts';
import { startTcpProxy } from '../../fixtures/tcp-proxy.ts';
import { cpUrl, operatorCli } from './operator-cli-fixture.ts';

// dvx audit against a real control plane whose audit goes through its WAL into PostgreSQL: list with
// the spec's filters, an agent's LLM audit log, `tail` as a child process receiving a record written
// after it started, and `tail` resuming with Last-Event-ID, without duplicates, after its connection is
// cut (a TCP relay in front of the control plane, cut and restored on the same port); the broker's own
// audit with --local; local validation of the filters (exit 2, nothing sent); refusals (exit 4).

const pgDb = await freshPgDatabase('dvx_cli_audit');
if (!pgDb) {
  if (process.env.CI) t.fail('PostgreSQL is not reachable on 127.0.0.1:5432');
  else t.comment('PostgreSQL is not reachable on 127.0.0.1:5432: skipped');
} else {
  t.teardown(() => pgDb.drop());
  const dir = await mkdtemp(join(tmpdir(), 'dvx-cli-audit-'));
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  const h = await startCpHarness(
    [
      { clientId: 'root', org: 'org-a', human: true },
      { clientId: 'nobody', org: 'org-a', human: true },
    ],
    { seedAdmin: ['root'] },
  );
  t.teardown(() => h.close());
  const cp = await h.start(
    { seedAdmin: ['root'], auditDsn: pgDb.dsn, auditWalDir: join(dir, 'wal'), auditStreamPollMs: 100 },
    null,
  );
  t.teardown(() => cp.close());
  const proxy = await startTcpProxy(cp.port);
  t.teardown(() => proxy.close());
  const cli = await operatorCli(t, h.issuer, h.ca, cpUrl(h, cp.port));
  const createOrg = async (id: string) => {
    const r = await h.callAt(cp.port, 'root', 'POST', '/orgs', { id, name: id });
    if (r.status !== 201) throw new Error(`create org ${id}: ${r.status}`);
  };
  await createOrg('org-a');
  await h.callAt(cp.port, 'root', 'POST', '/orgs/org-a/agents', { uid: 'bot-1', name: 'builder' });

  /** `dvx audit tail …` as a child process; its stdout lines as they come. */
  const startTail = async (args: string[], url: string) => {
    const env: Record<string, string | undefined> = { ...process.env };
    for (const k of Object.keys(env)) if (k.startsWith('DVX_')) delete env[k];
    const token = join(cli.dir, 'tail.token');
    await writeFile(token, await h.issuer.token('root'), { mode: 0o600 });
    const child = spawn(DVX_BIN, ['audit', 'tail', ...args], {
      env: { ...env, DVX_CONTROLPLANE: url, DVX_TOKEN_FILE: token, DVX_CA_CERT: cli.ca },
      stdio: ['pipe', 'pipe', 'pipe'],
    }) as ChildProcessWithoutNullStreams;
    child.stdin.end();
    let stderr = '';
    child.stderr.on('data', (d) => (stderr += d));
    const lines: string[] = [];
    const waiters: (() => void)[] = [];
    createInterface({ input: child.stdout }).on('line', (l) => {
      lines.push(l);
      for (const w of waiters.splice(0)) w();
    });
    const exited = once(child, 'exit');
    t.teardown(async () => {
      if (child.exitCode === null && child.signalCode === null) {
        child.kill('SIGTERM');
        await exited;
      }
    });
    return {
      child,
      lines,
      stderr: () => stderr,
      exited,
      /** Resolves once `n` lines arrived (the test's own timeout bounds the wait). */
      async until(n: number) {
        while (lines.length < n) await new Promise<void>((r) => waiters.push(r));
      },
    };
  };

  t.test('audit tail receives a record written after it started, one JSON line when piped', async (t) => {
    const since = new Date().toISOString();
    const tail = await startTail(['--action', 'org.create', '--since', since], cpUrl(h, cp.port));
    await createOrg('org-tail-1');
    await tail.until(1);
    const record = JSON.parse(tail.lines[0]);
    t.match(record, { action: 'org.create', actor: 'root', org_id: 'org-tail-1', outcome: 'allow' });
    tail.child.kill('SIGINT');
    const [code] = await tail.exited;
    t.equal(code, 0, 'Ctrl-C ends the tail cleanly');
    t.equal(tail.stderr(), '');
  });

  t.test(
    'audit tail resumes with Last-Event-ID after its connection is cut: nothing lost, nothing twice',
    async (t) => {
      const since = new Date().toISOString();
      const tail = await startTail(['--action', 'org.create', '--since', since], `https://127.0.0.1:${proxy.port}`);
      await createOrg('org-cut-1');
      await tail.until(1);
      await proxy.cut();
      // Written while the tail cannot reach the control plane.
      await createOrg('org-cut-2');
      await proxy.restore();
      await tail.until(2);
      await createOrg('org-cut-3');
      await tail.until(3);
      const orgs = tail.lines.map((l) => JSON.parse(l).org_id);
      t.same(orgs, ['org-cut-1', 'org-cut-2', 'org-cut-3'], 'each record once, in order');
      t.match(tail.stderr(), /resuming after \d+\.|reconnecting/, 'the operator is told');
      tail.child.kill('SIGTERM');
      await tail.exited;
      t.same(tail.lines.length, 3, 'no duplicate arrived before the end');
    },
  );

  t.test('audit list with filters; table on request; paging', async (t) => {
    const page = await cli.json('root', [
      'audit',
      'list',
      '--action',
      'org.create',
      '--outcome',
      'allow',
      '--limit',
      '2',
    ]);
    t.equal(page.records.length, 2);
    t.ok(page.records.every((r: { action: string }) => r.action === 'org.create'));
    t.equal(page.next_offset, 2);
    const next = await cli.json('root', ['audit', 'list', '--action', 'org.create', '--limit', '2', '--offset', '2']);
    t.equal(next.next_offset, 2 + next.records.length);
    const byOrg = await cli.json('root', [
      'audit',
      'list',
      '--org',
      'org-tail-1',
      '--actor-kind',
      'human-operator',
      '--since',
      '2020-01-01T00:00:00Z',
    ]);
    t.ok(byOrg.records.length >= 1);
    t.ok(byOrg.records.every((r: { org_id: string }) => r.org_id === 'org-tail-1'));
    const table = await cli.dvx('root', [
      'audit',
      'list',
      '--action',
      'org.create',
      '--limit',
      '1',
      '--output',
      'table',
    ]);
    t.match(table.stdout, /^EVENT_TIME\s+OUTCOME\s+ACTION\s+ACTOR/);
    t.match(table.stdout, /\(next page: --offset 1\)/);
    const log = await cli.json('root', ['audit', 'agent', 'bot-1']);
    t.same(log, { entries: [], next_offset: 0 });
  });

  t.test('malformed filters fail locally with exit 2; a refused reader gets exit 4', async (t) => {
    for (const [args, message] of [
      [['--since', 'yesterday'], /--since: must be an RFC 3339 date-time/],
      [['--since', '2026-11-22T10:00:00Z', '--until', '2026-11-21T10:00:00Z'], /--since: is after until/],
      [['--limit', 'many'], /--limit: must be a non-negative integer/],
      [['--outcome', 'maybe'], /argument 'maybe' is invalid/],
    ] as [string[], RegExp][]) {
      const r = await cli.dvx('root', ['audit', 'list', ...args], { url: 'https://127.0.0.1:1' });
      t.equal(r.code, 2, args.join(' '));
      t.match(r.stderr, message);
    }
    const refused = await cli.dvx('nobody', ['audit', 'list']);
    t.equal(refused.code, 4);
    t.match(refused.stderr, /^dvx: 403 /);
    const tail = await cli.dvx('nobody', ['audit', 'tail']);
    t.equal(tail.code, 4, 'a refused stream ends the tail with its error');
  });

  t.test('--local: the broker answers for its own audit (here: it has no store, 404 naming the flag)', async (t) => {
    const b = await startBrokerHarness({ seedAdmin: ['admin-a'] }, [
      { clientId: 'admin-a', org: 'org-a', human: true },
    ]);
    t.teardown(() => b.close());
    const local = await operatorCli(t, b.issuer!, b.tls.ca.certPem, null);
    const broker = `https://127.0.0.1:${b.broker.operatorPort}`;
    for (const verb of ['list', 'tail']) {
      const r = await local.dvx('admin-a', ['audit', verb, '--local'], { broker });
      t.equal(r.code, 5, `${verb}: ${r.stderr}`);
      t.match(r.stderr, /^dvx: 404 .*no audit store \(--audit-dsn\)/);
    }
    const noBroker = await local.dvx('admin-a', ['audit', 'list', '--local']);
    t.equal(noBroker.code, 2);
    t.match(noBroker.stderr, /--broker is required/);
  });
}
