import t from 'tap';
import { createServer } from 'node:net';
import { readdir } from 'node:fs/promises';
import { join } from 'node:path';
import pg from 'pg';
import Anthropic from '@anthropic-ai/sdk';
import { Agent, fetch as undiciFetch, request } from 'undici';
import { startDvxServer, type DvxServer } from '../fixtures/dvx-server.ts';
import { until } from '../fixtures/eventually.ts';
import { freshPgDatabase } from '../fixtures/pg-database.ts';
import { runDvx } from '../fixtures/run-dvx.ts';
import { startCliWorld, type CliWorld } from '../proxy/egress/e2e-cli-harness.ts';

// `dvx serve llmproxy --workers N` as an operator runs it: the real binary, a real node:http provider
// upstream, real TLS, audit shipped to a real PostgreSQL. Which worker served a call shows in its
// record's spool (<audit-wal-dir>/worker-<slot>) and in the workers' log lines (`worker`).

const fresh = await freshPgDatabase('dvx_workers');
if (!fresh) {
  // Several workers need a store several processes can write: PostgreSQL here.
  if (process.env.CI) t.fail('PostgreSQL is not running on 127.0.0.1:5432');
  else t.plan(0, 'PostgreSQL not reachable');
  process.exit();
}
const db = fresh;
const world: CliWorld = await startCliWorld();
t.teardown(async () => {
  await world.close();
  await db.drop();
});

const walDir = world.file('wal');

function llmproxy(extra: string[]): Promise<DvxServer> {
  return startDvxServer(
    [
      'serve',
      'llmproxy',
      '--tls-cert',
      world.file('cert.pem'),
      '--tls-key',
      world.file('key.pem'),
      '--agent-jwks',
      world.file('jwks.json'),
      '--policy-snapshot',
      world.file('snapshot.json'),
      '--secrets-file',
      world.file('secrets.json'),
      '--upstream-default',
      world.llmUpstream.url,
      '--audit-dsn',
      db.dsn,
      '--audit-wal-dir',
      walDir,
      ...extra,
    ],
    'llmproxy listening',
  );
}

/** The primary's line once every worker is ready (the first "llmproxy listening" is one worker's). */
async function primaryReady(server: DvxServer): Promise<Record<string, unknown>> {
  t.ok(await until(() => server.lines.some((l) => l.msg === 'llmproxy workers ready')), 'the workers are ready');
  return server.lines.find((l) => l.msg === 'llmproxy workers ready')!;
}

/** One call on a connection of its own, so the primary's round robin spreads calls over the workers. */
async function call(port: number, n: number): Promise<number> {
  const dispatcher = new Agent({ connect: { ca: world.ca.certPem } });
  try {
    const r = await request(`https://127.0.0.1:${port}/v1/messages`, {
      method: 'POST',
      dispatcher,
      headers: {
        'content-type': 'application/json',
        'anthropic-version': '2023-06-01',
        'x-api-key': await world.token(),
      },
      body: JSON.stringify({
        model: 'claude-sonnet-4-5',
        max_tokens: 16,
        messages: [{ role: 'user', content: `call ${n}` }],
      }),
    });
    await r.body.text();
    return r.statusCode;
  } finally {
    await dispatcher.close();
  }
}

async function storedRows(): Promise<number> {
  const c = new pg.Client({ connectionString: db.dsn });
  await c.connect();
  try {
    const r = await c.query('SELECT count(*)::int AS n FROM llm_audit_log');
    return r.rows[0].n as number;
  } catch {
    return 0; // the schema is not there before the first shipment
  } finally {
    await c.end();
  }
}

async function spoolRecords(spool: string): Promise<number> {
  const r = await runDvx(['wal', 'tail', '--all', '--table', 'llm_audit_log', '--dir', join(walDir, spool)]);
  return r.stdout.split('\n').filter(Boolean).length;
}

const pidsOf = (server: DvxServer, msg: string) =>
  server.lines.filter((l) => l.msg === msg).map((l) => ({ worker: l.worker, pid: l.pid as number }));

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

let served = 0;

t.test('--workers 2: both workers serve, each spools and ships, dvx wal and the metrics see both', async (t) => {
  const server = await llmproxy(['--addr', '127.0.0.1:0', '--workers', '2', '--metrics-addr', '127.0.0.1:0']);
  t.teardown(() => server.stop());
  const ready = await primaryReady(server);
  t.equal(ready.workers, 2);
  const port = server.port;
  const statuses = [];
  for (let i = 0; i < 12; i++) statuses.push(await call(port, i));
  t.same(new Set(statuses), new Set([200]), 'every call answered');
  served += 12;
  const one = await spoolRecords('worker-1');
  const two = await spoolRecords('worker-2');
  t.equal(one + two, 12, 'every record is in a worker spool');
  t.ok(one > 0 && two > 0, `both workers served (${one} + ${two})`);
  t.ok(await until(async () => (await storedRows()) === 12), 'both spools shipped to PostgreSQL');

  const stat = await runDvx(['wal', 'stat', '--dir', walDir]);
  t.equal(stat.code, 0, stat.stderr);
  const rows = stat.stdout
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l) as { spool: string; table: string });
  t.same(
    new Set(rows.filter((r) => r.table === 'llm_audit_log').map((r) => r.spool)),
    new Set(['worker-1', 'worker-2']),
    'dvx wal stat over --audit-wal-dir lists each worker',
  );
  const tail = await runDvx(['wal', 'tail', '--all', '--table', 'llm_audit_log', '--dir', walDir]);
  const tailed = tail.stdout
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l) as { spool: string; record: { id: string } });
  t.equal(tailed.length, 12, 'dvx wal tail reads every spool');
  t.same(new Set(tailed.map((r) => r.spool)), new Set(['worker-1', 'worker-2']), 'and says which worker wrote it');

  const metricsPort = ready.metrics_port as number;
  const dispatcher = new Agent({ connect: { ca: world.ca.certPem } });
  t.teardown(() => dispatcher.close());
  const text = await (await request(`https://127.0.0.1:${metricsPort}/metrics`, { dispatcher })).body.text();
  t.match(text, /dvx_audit_wal_appended_total\{table="llm_audit_log"\} 12\b/, 'the metrics sum both workers');
  t.match(text, /dvx_workers 2\b/, 'and count them');
  t.equal(await server.stop(), 0, 'SIGTERM: a graceful stop of all, primary last');
  t.notOk(
    server.lines.some((l) => l.msg === 'worker exited unexpectedly; replacing it'),
    'no worker was lost',
  );
});

t.test('SIGHUP rolls the workers one at a time under load: no failed call, no lost record', async (t) => {
  const server = await llmproxy(['--addr', '127.0.0.1:0', '--workers', '2']);
  t.teardown(() => server.stop());
  await primaryReady(server);
  // Agents as they run: the official SDK, its pooled keep-alive connections and its default retries
  // (a connection cut as its worker retires is retried on a new connection; a call that reaches a
  // retiring worker on a connection it had open is served, with `connection: close`).
  const dispatcher = new Agent({ connect: { ca: world.ca.certPem } });
  t.teardown(() => dispatcher.close());
  const fetch = ((input: string, init: object) =>
    undiciFetch(input, { ...init, dispatcher } as never)) as unknown as typeof globalThis.fetch;
  const client = new Anthropic({ apiKey: await world.token(), baseURL: `https://127.0.0.1:${server.port}`, fetch });
  let stop = false;
  let ok = 0;
  const failed: string[] = [];
  const load = Array.from({ length: 3 }, async (_, k) => {
    for (let i = 0; !stop; i++) {
      try {
        await client.messages.create({
          model: 'claude-sonnet-4-5',
          max_tokens: 16,
          messages: [{ role: 'user', content: `load ${k}.${i}` }],
        });
        ok++;
      } catch (err) {
        failed.push((err as Error).message);
      }
    }
  });
  await new Promise((r) => setTimeout(r, 300));
  server.process.kill('SIGHUP');
  t.ok(
    await until(() => server.lines.some((l) => l.msg === 'rolling restart done'), 60_000),
    'the rolling restart finished',
  );
  await new Promise((r) => setTimeout(r, 300));
  stop = true;
  await Promise.all(load);
  t.ok(ok > 10, `calls went on throughout (${ok})`);
  t.same(failed, [], 'zero failed calls');
  t.equal(pidsOf(server, 'worker started').length, 4, 'two replacements were forked');
  served += ok;
  t.ok(
    await until(async () => (await storedRows()) === served, 30_000),
    `every answered call's record reached the store (${served}), the retired workers' spools too`,
  );
  t.equal(await server.stop(), 0);
});

t.test('a SIGKILLed worker is replaced; a SIGKILLed primary leaves the port free', async (t) => {
  const server = await llmproxy(['--addr', '127.0.0.1:0', '--workers', '2']);
  t.teardown(() => server.stop(2000));
  await primaryReady(server);
  const port = server.port;
  const victim = server.lines.find((l) => l.msg === 'worker started')!;
  process.kill(victim.pid as number, 'SIGKILL');
  t.ok(
    await until(() => server.lines.some((l) => l.msg === 'worker exited unexpectedly; replacing it')),
    'the crash is logged',
  );
  t.ok(await until(() => pidsOf(server, 'worker started').length === 3), 'and a replacement is started');
  t.ok(await until(() => server.lines.filter((l) => l.msg === 'llmproxy listening').length === 3), 'which listens');
  for (let i = 0; i < 4; i++) t.equal(await call(port, i), 200);
  served += 4;

  const workers = pidsOf(server, 'worker started')
    .map((w) => w.pid)
    .filter(alive);
  t.equal(workers.length, 2);
  server.process.kill('SIGKILL');
  t.ok(await until(() => workers.every((pid) => !alive(pid)), 10_000), 'the orphaned workers stop on their own');
  const bound = await new Promise<boolean>((resolve) => {
    const probe = createServer();
    probe.once('error', () => resolve(false));
    probe.listen(port, '127.0.0.1', () => probe.close(() => resolve(true)));
  });
  t.ok(bound, 'nothing holds the port: a restart can bind it');
  // The workers stopped without waiting for their shippers: what did not ship yet is durable in their
  // spools (a record is durable before its answer), and the next run ships it (next test).
  const spooled = await runDvx(['wal', 'tail', '--all', '--table', 'llm_audit_log', '--dir', walDir]);
  t.equal(spooled.stdout.split('\n').filter(Boolean).length, served, 'no record lost: every answered call is spooled');
});

t.test('a spool with no live worker is shipped: --workers 1 ships the worker spools left behind', async (t) => {
  // A run killed before its spool shipped leaves records in a worker spool that no worker of the next
  // run owns: made here from a real record of the runs above, under new ids the store has not seen.
  const sample = JSON.parse(
    (
      await runDvx(['wal', 'tail', '--all', '--table', 'llm_audit_log', '--dir', join(walDir, 'worker-1')])
    ).stdout.split('\n')[0],
  ) as Record<string, unknown>;
  const spool = join(walDir, 'worker-7');
  const { WalTable } = await import('../../audit-wal/wal-table.ts');
  const table = await WalTable.open(join(spool, 'llm_audit_log'), 'llm_audit_log');
  for (let i = 0; i < 3; i++) await table.append({ ...sample, id: `${String(sample.id)}-orphan-${i}` });
  await table.close();
  const server = await llmproxy(['--addr', '127.0.0.1:0', '--workers', '1']);
  t.teardown(() => server.stop());
  t.ok(
    await until(() => server.lines.some((l) => l.msg === 'audit spool left without a writer: shipped')),
    'the one process ships the spools of earlier workers',
  );
  t.ok(
    await until(async () => (await storedRows()) === served + 3),
    "every spooled record is in the store: the earlier runs' and these",
  );
  t.ok((await readdir(walDir)).includes('llm_audit_log'), '--workers 1 spools at the top level, as before');
  t.equal(await server.stop(), 0, 'and it stops cleanly');
});

t.test('the gateway with --workers 2: blind tunnels through both workers, each spooling its flows', async (t) => {
  const gwWal = world.file('gateway-wal');
  const gw = await world.gateway([
    '--no-http-capture',
    '--workers',
    '2',
    '--audit-dsn',
    db.dsn,
    '--audit-wal-dir',
    gwWal,
  ]);
  t.teardown(() => gw.stop());
  t.ok(await until(() => gw.lines.some((l) => l.msg === 'gateway workers ready')), 'the workers are ready');
  const token = await world.token();
  for (let i = 0; i < 8; i++) {
    const r = await world.curlVia(gw, token, [
      '--cacert',
      world.file('ca.pem'),
      `https://127.0.0.1:${world.secureEcho.port}/tunnel-${i}`,
    ]);
    t.equal(r.code, 0, r.stderr);
  }
  const flows = async (spool: string) =>
    (await runDvx(['wal', 'tail', '--all', '--table', 'network_flow', '--dir', join(gwWal, spool)])).stdout
      .split('\n')
      .filter(Boolean).length;
  t.ok(await until(async () => (await flows('worker-1')) + (await flows('worker-2')) === 8), 'every flow is spooled');
  t.ok((await flows('worker-1')) > 0 && (await flows('worker-2')) > 0, 'by both workers');
  t.equal(await gw.stop(), 0, 'SIGTERM stops the workers and then the primary');
});

t.test('a start that fails in the workers stops the primary with their error; pglite is one process', async (t) => {
  const base = [
    'serve',
    'llmproxy',
    '--addr',
    '127.0.0.1:0',
    '--tls-cert',
    world.file('cert.pem'),
    '--tls-key',
    world.file('key.pem'),
    '--agent-jwks',
    world.file('jwks.json'),
  ];
  const bad = await runDvx([
    ...base,
    '--workers',
    '2',
    '--audit-dsn',
    db.dsn,
    '--audit-wal-dir',
    world.file('wal-bad'),
    '--gateway-key',
    world.file('missing.pem'),
  ]);
  t.equal(bad.code, 2, 'the exit code of the workers');
  t.match(bad.stderr, /cannot read --gateway-key .*missing\.pem: ENOENT/, "the workers' error");
  t.match(bad.stderr, /exited before it was ready/, "and the primary's");
  const pglite = await runDvx([
    ...base,
    '--workers',
    '2',
    '--audit-dsn',
    `pglite://${world.file('pglite')}`,
    '--audit-wal-dir',
    world.file('wal-pglite'),
  ]);
  t.equal(pglite.code, 2);
  t.match(pglite.stderr, /--workers 2: a pglite:\/\/ audit store is one process's database/);
});
