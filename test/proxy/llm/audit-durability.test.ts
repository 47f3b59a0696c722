import t from 'tap';
import { spawn, execFileSync } from 'node:child_process';
import { closeSync, openSync, readFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Agent, request } from 'undici';
import { WalTable } from '../../../audit-wal/wal-table.ts';
import { WalSink } from '../../../audit-wal/wal-sink.ts';
import { createLogger } from '../../../core/logger.ts';
import { createRegistry } from '../../../core/metrics.ts';
import type { AuditSink } from '../../../audit-wal/sink.ts';
import { freePort } from '../../fixtures/free-port.ts';
import { DVX_BIN } from '../../fixtures/run-dvx.ts';
import { REPLY } from '../../fixtures/llm-upstream.ts';
import { serveArgs, startHarness } from '../../fixtures/llmproxy-harness.ts';

// Audit, then replay: with a durable sink an answer leaves only once its record is durable; when the
// record cannot be made durable in time the answer is refused (503), or a stream loses its final event.

const body = (extra: Record<string, unknown> = {}) =>
  JSON.stringify({ model: 'claude-sonnet-4-5', max_tokens: 8, messages: [{ role: 'user', content: 'hi' }], ...extra });

async function readWal(dir: string): Promise<Record<string, unknown>[]> {
  const table = await WalTable.open(join(dir, 'llm_audit_log'), 'llm_audit_log');
  const out: Record<string, unknown>[] = [];
  let pos = table.checkpoint;
  for (;;) {
    const { records, next } = await table.read(pos, 1000);
    if (records.length === 0) break;
    for (const r of records) out.push(JSON.parse(r.payload.toString()));
    pos = next;
  }
  await table.close();
  return out;
}

t.test('with a WAL, the record is durable before the answer leaves', async (t) => {
  const walDir = await mkdtemp(join(tmpdir(), 'dvx-pwal-'));
  const storeDir = await mkdtemp(join(tmpdir(), 'dvx-pstore-'));
  t.teardown(() =>
    Promise.all([rm(walDir, { recursive: true, force: true }), rm(storeDir, { recursive: true, force: true })]),
  );
  const log = createLogger({ level: 'error', destination: { write: () => {} } });
  // A store that is never reachable keeps every record in the WAL, where the test can see it.
  const sink = await WalSink.open({
    dir: walDir,
    dsn: 'postgres://nobody@127.0.0.1:1/none',
    log,
    registry: createRegistry(),
    tables: ['llm_audit_log'],
  });
  const h = await startHarness({ audit: sink, durableAudit: true });
  t.teardown(() => h.close());
  const plain = await h.call('/v1/messages', {
    headers: { 'content-type': 'application/json', 'x-api-key': await h.token() },
    body: body(),
  });
  t.equal(plain.status, 200);
  const streamed = await h.call('/v1/messages', {
    headers: { 'content-type': 'application/json', 'x-api-key': await h.token() },
    body: body({ stream: true }),
  });
  t.match(streamed.text, /event: message_stop/, 'the final event arrives');
  const table = sink.table('llm_audit_log')!;
  const { records } = await table.read(table.checkpoint, 10);
  t.equal(records.length, 2, 'both records were in the WAL by the time the answers arrived');
});

function stalledSink(): AuditSink {
  return { append: () => new Promise<void>(() => {}), flush: async () => {}, close: async () => {} };
}

t.test('capture-or-deny: a record that is not durable in time refuses the answer', async (t) => {
  const h = await startHarness({ audit: stalledSink(), durableAudit: true, proxy: { auditCaptureTimeout: 200 } });
  t.teardown(() => h.close());
  const started = Date.now();
  const plain = await h.call('/v1/messages', {
    headers: { 'content-type': 'application/json', 'x-api-key': await h.token() },
    body: body(),
  });
  t.equal(plain.status, 503);
  t.same(JSON.parse(plain.text), {
    type: 'error',
    error: { type: 'audit_unavailable', message: 'Request rejected: the audit record could not be made durable.' },
  });
  t.notMatch(plain.text, new RegExp(REPLY), 'nothing of the answer leaked');
  t.ok(Date.now() - started < 3000, 'refused at the capture timeout');
  const res = await request(`${h.url}/v1/messages`, {
    method: 'POST',
    dispatcher: h.dispatcher,
    headers: { 'content-type': 'application/json', 'x-api-key': await h.token() },
    body: body({ stream: true }),
  });
  const text = await res.body.text().catch(() => 'CUT');
  t.notMatch(text, /message_stop/, 'a stream never gets its final event');
});

t.test(
  'capture-or-deny: a late record and the refusal are two records, and pass-through answers are gated too',
  async (t) => {
    const got: Record<string, unknown>[] = [];
    const slow: AuditSink = {
      append: (_table, record) =>
        new Promise<void>((r) =>
          setTimeout(() => {
            got.push(record);
            r();
          }, 400),
        ),
      flush: async () => {},
      close: async () => {},
    };
    const h = await startHarness({ audit: slow, durableAudit: true, proxy: { auditCaptureTimeout: 100 } });
    t.teardown(() => h.close());
    const plain = await h.call('/v1/messages', {
      headers: { 'content-type': 'application/json', 'x-api-key': await h.token() },
      body: body({ metadata: { user_id: 'late' } }),
    });
    t.equal(plain.status, 503);
    await new Promise((r) => setTimeout(r, 600));
    const mine = [...got];
    t.equal(mine.length, 2, 'the record handed to the sink, and the refusal');
    const attempted = mine.find((r) => !String(r.id).endsWith('.refused'))!;
    t.match(attempted, { status: 200, upstream_status: 200 }, 'what was about to be answered');
    t.match(
      mine.find((r) => r.id === `${attempted.id}.refused`),
      { status: 503, upstream_status: 200, error: /not durable within 100 ms/ },
      'what the agent got',
    );

    const models = await request(`${h.url}/v1/models`, {
      method: 'GET',
      dispatcher: h.dispatcher,
      headers: { 'x-api-key': await h.token(), 'anthropic-version': '2023-06-01' },
    });
    const text = await models.body.text().then(
      () => 'complete',
      () => 'cut',
    );
    t.equal(text, 'cut', 'a pass-through answer never completes without its record');
  },
);

t.test('capture-or-deny off: the answer goes out and the failure is logged', async (t) => {
  const failing: AuditSink = {
    append: () => Promise.reject(new Error('disk on fire')),
    flush: async () => {},
    close: async () => {},
  };
  const h = await startHarness({ audit: failing, durableAudit: true, proxy: { auditCaptureOrDeny: false } });
  t.teardown(() => h.close());
  const r = await h.call('/v1/messages', {
    headers: { 'content-type': 'application/json', 'x-api-key': await h.token() },
    body: body(),
  });
  t.equal(r.status, 200);
  await new Promise((res) => setTimeout(res, 50));
  t.ok(h.logs.some((l) => /audit record lost/.test(String(l.msg))));
});

t.test('a full disk under the WAL (real tmpfs) refuses answers with 503', async (t) => {
  if (process.getuid?.() !== 0) {
    t.plan(0, 'needs root to mount a tmpfs');
    return;
  }
  const walDir = await mkdtemp(join(tmpdir(), 'dvx-fullwal-'));
  execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=64k', 'tmpfs', walDir]);
  const log = createLogger({ level: 'error', destination: { write: () => {} } });
  const sink = await WalSink.open({
    dir: walDir,
    dsn: 'postgres://nobody@127.0.0.1:1/none',
    log,
    registry: createRegistry(),
    tables: ['llm_audit_log'],
  });
  const h = await startHarness({ audit: sink, durableAudit: true });
  t.teardown(async () => {
    await h.close();
    execFileSync('umount', [walDir]);
    await rm(walDir, { recursive: true, force: true });
  });
  let status = 200;
  for (let i = 0; i < 200 && status === 200; i++) {
    status = (
      await h.call('/v1/messages', {
        headers: { 'content-type': 'application/json', 'x-api-key': await h.token() },
        body: body({ metadata: { user_id: 'x'.repeat(2000) } }),
      })
    ).status;
  }
  t.equal(status, 503, 'once the disk is full, answers are refused');
});

/** A dvx llmproxy process (to be killed), served by a harness's upstream, keys and snapshot. */
async function killableProxy(
  t: { teardown: (fn: () => unknown) => void },
  prefix: string,
  extraArgs: (dir: string) => string[],
  stdout: (dir: string) => 'ignore' | number,
) {
  const dir = await mkdtemp(join(tmpdir(), prefix));
  const upstreamHarness = await startHarness();
  // Whatever was spawned is killed before its directory goes (a failed start included).
  const stops: (() => Promise<unknown>)[] = [];
  t.teardown(async () => {
    await Promise.all(stops.map((stop) => stop()));
    await upstreamHarness.close();
    await rm(dir, { recursive: true, force: true });
  });
  const hd = upstreamHarness.dir;
  // Spawned on a free port; one that another socket takes before the child binds it makes the child
  // exit at once (EADDRINUSE), and it is spawned again on another.
  for (let attempt = 1; ; attempt++) {
    const port = await freePort();
    const out = stdout(dir);
    const child = spawn(DVX_BIN, serveArgs(hd, `127.0.0.1:${port}`, extraArgs(dir)), {
      stdio: ['ignore', out, 'inherit'],
    });
    if (typeof out === 'number') closeSync(out);
    let gone = false;
    const exited = new Promise((r) => child.on('exit', r)).then(() => {
      gone = true;
    });
    stops.push(async () => {
      if (!gone) child.kill('SIGKILL');
      await exited;
    });
    const dispatcher = new Agent({ connect: { ca: upstreamHarness.ca.certPem } });
    t.teardown(() => dispatcher.close());
    const url = `https://127.0.0.1:${port}`;
    let ready = false;
    for (let i = 0; i < 600 && !gone && !ready; i++) {
      ready = await request(`${url}/healthz`, { dispatcher }).then(
        (r) => r.body.text().then(() => r.statusCode === 200),
        () => false,
      );
      if (!ready) await new Promise((r) => setTimeout(r, 100));
    }
    if (ready)
      return {
        dir,
        url,
        dispatcher,
        token: await upstreamHarness.token(),
        kill: async () => {
          child.kill('SIGKILL');
          await exited;
        },
      };
    if (!gone || attempt === 3) throw new Error(`llmproxy did not start (attempt ${attempt}, port ${port})`);
  }
}

t.test('SIGKILL right after answers: every answered call has its record', async (t) => {
  const { dir, url, dispatcher, token, kill } = await killableProxy(
    t,
    'dvx-kill-',
    // One process (--workers 1): the test SIGKILLs the process that appends and reads its spool, the
    // top-level one (several workers would spool under wal/worker-<k> and outlive a killed primary).
    (d) => ['--audit-dsn', 'postgres://nobody@127.0.0.1:1/none', '--audit-wal-dir', join(d, 'wal'), '--workers', '1'],
    () => 'ignore',
  );
  const walDir = join(dir, 'wal');
  const answered: string[] = [];
  await Promise.all(
    Array.from({ length: 40 }, async (_, i) => {
      const res = await request(`${url}/v1/messages`, {
        method: 'POST',
        dispatcher,
        headers: { 'content-type': 'application/json', 'x-api-key': token },
        body: body({ metadata: { user_id: `call-${i}` }, stream: i % 2 === 0 }),
      });
      const text = await res.body.text();
      if (res.statusCode === 200 && (text.includes('message_stop') || text.includes(REPLY))) answered.push(`call-${i}`);
    }),
  );
  await kill();
  const records = await readWal(walDir);
  t.equal(answered.length, 40, 'every call was answered');
  t.equal(records.length, 40, 'and every one has its record after SIGKILL');
});

t.test('on stdout too: SIGKILL right after answers and refusals, every one has its line', async (t) => {
  const { dir, url, dispatcher, token, kill } = await killableProxy(
    t,
    'dvx-kill-stdout-',
    () => [],
    (d) => openSync(join(d, 'stdout'), 'w'),
  );
  const answered: string[] = [];
  await Promise.all(
    Array.from({ length: 45 }, async (_, i) => {
      // Every third call carries a key the policy blocks: a refusal is an answer too.
      const content = i % 3 === 2 ? 'key AKIAIOSFODNN7EXAMPLE' : 'hi';
      const res = await request(`${url}/v1/messages`, {
        method: 'POST',
        dispatcher,
        headers: { 'content-type': 'application/json', 'x-api-key': token },
        body: JSON.stringify({
          model: 'claude-sonnet-4-5',
          max_tokens: 8,
          messages: [{ role: 'user', content }],
          metadata: { user_id: `call-${i}` },
          stream: i % 3 === 0,
        }),
      });
      const text = await res.body.text();
      if ((res.statusCode === 200 && (text.includes('message_stop') || text.includes(REPLY))) || res.statusCode === 403)
        answered.push(`call-${i}`);
    }),
  );
  await kill();
  const lines = readFileSync(join(dir, 'stdout'), 'utf8')
    .split('\n')
    .filter((l) => l.includes('"stream":"audit"'))
    .map((l) => JSON.parse(l) as Record<string, unknown>);
  t.equal(answered.length, 45, 'every call was answered');
  t.equal(lines.length, 45, 'and every one has its audit line after SIGKILL');
  t.equal(
    lines.filter((l) => l.status === 403 && l.decision === 'block').length,
    15,
    'the refusals with their findings',
  );
});
