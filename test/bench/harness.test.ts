import { test } from 'tap';
import { spawn } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Agent, request } from 'undici';
import { loadTable } from '../../bench/all.ts';
import { conditions, UNPINNED } from '../../bench/conditions.ts';
import { fullSetSnapshot, writeAgentIdentity, writeJson, writeServerTls } from '../../bench/fixtures.ts';
import { rssOf, treeCpuSeconds, treeRss } from '../../bench/proc-stats.ts';
import { NODE, stopChild } from '../../bench/processes.ts';
import { startLlmproxy } from '../../bench/servers.ts';
import { median, p50p99, quantile } from '../../bench/stats.ts';

// The benchmarks' shared harness (bench/processes.ts, servers.ts, proc-stats.ts, stats.ts,
// conditions.ts): what every bench now relies on, checked against real processes. Speed is not judged.

test('quantiles are the sample at floor(q·n) of the sorted samples, as every bench computed them', (t) => {
  const xs = [5, 1, 4, 2, 3, 10, 9, 8, 7, 6];
  const before = [...xs];
  t.equal(quantile(xs, 0.5), 6, 'n = 10: the 6th smallest');
  t.equal(median(xs), 6);
  t.same(p50p99(xs), { p50: 6, p99: 10 }, 'p99 of 10 samples is the largest');
  t.same(xs, before, 'the samples are not reordered');
  t.ok(Number.isNaN(quantile([], 0.5)), 'no samples: NaN, not undefined');
  const many = Array.from({ length: 1000 }, (_, i) => 1000 - i);
  t.same(p50p99(many), { p50: 501, p99: 991 });
  t.end();
});

test('a bench states its conditions: load average at its start and end, and its pinning', (t) => {
  const line = conditions('the bench’s own words', UNPINNED);
  t.match(line, /^Node v\d+/);
  t.match(line, /\d+ cores/);
  t.match(
    line,
    /load average \(1\/5\/15 min\) [\d.]+ \/ [\d.]+ \/ [\d.]+ at the start, [\d.]+ \/ [\d.]+ \/ [\d.]+ at the end/,
  );
  t.match(line, 'not pinned');
  t.ok(line.endsWith('the bench’s own words'));
  t.end();
});

test('the summary of `all` gives each bench its time and load average', (t) => {
  const out = loadTable([
    { bench: 'wal', markdown: '', summary: [], seconds: 12.4, failed: null, load: { start: 1.5, end: 3.25 } },
    { bench: 'proxy', markdown: '', summary: [], seconds: 90, failed: 'exit code 1' },
  ]);
  const lines = out.split('\n');
  t.match(lines[0], /\| bench +\| time +\| load average \(1 min\) at its start \| at its end \|/);
  t.match(lines[2], /\| wal +\| 12 s +\| 1\.50 +\| 3\.25 +\|/);
  t.match(lines[3], /\| proxy +\| 90 s +\| +\| +\|/, 'a bench without a reading shows none');
  t.end();
});

test('CPU time and memory of a process count the processes under it', async (t) => {
  // A parent that starts a child burning 600 ms of CPU (its own count, not the wall clock: the machine
  // is shared), then both wait. The parent alone uses far less.
  const childCode =
    'for (let u = process.cpuUsage(); u.user + u.system < 600000; u = process.cpuUsage()); setTimeout(() => {}, 60000)';
  const parent = spawn(
    NODE,
    [
      '-e',
      `require('node:child_process').spawn(process.execPath, ['-e', ${JSON.stringify(childCode)}], { stdio: 'inherit' }); setTimeout(() => {}, 60000)`,
    ],
    { stdio: 'ignore', detached: false },
  );
  t.teardown(() => {
    parent.kill('SIGKILL');
  });
  const pid = parent.pid!;
  // Wait until the child has burnt its CPU.
  let tree = 0;
  for (let i = 0; i < 600 && tree < 0.55; i++) {
    await new Promise((r) => setTimeout(r, 100));
    tree = await treeCpuSeconds(pid);
  }
  const own = await treeCpuSeconds(Number.NaN).catch(() => 0);
  t.equal(own, 0, 'no such process: nothing');
  t.ok(tree >= 0.55, `the tree used ${tree.toFixed(2)} s of CPU, the child's busy loop included`);
  const rss = (await rssOf(pid)) ?? 0;
  const total = (await treeRss(pid)) ?? 0;
  t.ok(rss > 0 && total > rss, `tree RSS ${total} exceeds the parent's own ${rss}`);
  // Kill the whole group: the child first (it is not ours otherwise).
  const children = (await import('node:fs/promises')).readFile(`/proc/${pid}/task/${pid}/children`, 'utf8');
  for (const c of (await children).split(' ').filter(Boolean)) process.kill(Number(c), 'SIGKILL');
  await stopChild(parent);
});

test('llmproxy started with a flag it does not know is started again without it, and says so', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'dvx-harness-test-'));
  const serverTls = await writeServerTls(dir);
  const identity = await writeAgentIdentity(dir);
  const tls = new Agent({ connect: { ca: serverTls.ca.certPem } });
  t.teardown(async () => {
    await tls.close();
    await rm(dir, { recursive: true, force: true });
  });
  const dvx = await startLlmproxy({
    name: 'dvx under test',
    port: 18991,
    certFile: serverTls.certFile,
    keyFile: serverTls.keyFile,
    jwksFile: identity.jwksFile,
    snapshotFile: await writeJson(dir, 'snap.json', fullSetSnapshot('http://127.0.0.1:9', true)),
    secretsFile: await writeJson(dir, 'secrets.json', { 'agent:agent-b': {} }),
    tls,
    flags: ['--no-such-flag-for-the-bench', '7'],
    cores: '0-1',
  });
  try {
    t.same(dvx.dropped, ['--no-such-flag-for-the-bench 7'], 'the flag and its value are named');
    t.ok(dvx.pid, 'the process under test has a pid');
    const res = await request(`${dvx.url}/healthz`, { dispatcher: tls });
    await res.body.dump();
    t.equal(res.statusCode, 200, 'and it answers');
  } finally {
    await dvx.stop();
  }
  t.ok((await rssOf(dvx.pid)) === null, 'stopped: gone from /proc');
});
