import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import t from 'tap';
import { startBrokerHarness } from '../../fixtures/broker-harness.ts';
import { DVX_BIN } from '../../fixtures/run-dvx.ts';
import { approvalRequest, satelliteTokenOf } from '../../enclave/broker/approvals-fixture.ts';
import { addAgent } from '../../enclave/broker/secrets-fixture.ts';
import { operatorCli } from './operator-cli-fixture.ts';

// dvx approvals against a real broker: approval requests as llmproxy creates them (the satellite route),
// listed, read, approved and denied with a reason from the CLI, and the live feed followed by `watch` as
// a child process; a decided approval is a conflict (exit 6), another org's a 404 (exit 5), a caller
// without the grant exit 4; bad ids and reasons fail locally.

const b = await startBrokerHarness({ seedAdmin: ['admin-a'] }, [
  { clientId: 'admin-a', org: 'org-a', human: true },
  { clientId: 'nobody-a', org: 'org-a', human: true },
]);
t.teardown(() => b.close());
await addAgent(b, 'agent-1', 'org-a', null);
await addAgent(b, 'agent-b', 'org-b', null);
const satellite = await satelliteTokenOf(b);
const broker = `https://127.0.0.1:${b.broker.operatorPort}`;
const cli = await operatorCli(t, b.issuer!, b.tls.ca.certPem, null);
const request = async (org = 'org-a', agent = 'agent-1') => {
  const r = await b.agent('POST', '/v1/satellite/approvals', approvalRequest(org, agent), satellite);
  if (r.status !== 201) throw new Error(`approval: ${r.status}`);
  return r.body.id as string;
};

t.test('watch follows the feed; approve and deny with a reason; list and get', async (t) => {
  const token = join(cli.dir, 'watch.token');
  await writeFile(token, await b.issuer!.token('admin-a'), { mode: 0o600 });
  const env: Record<string, string | undefined> = { ...process.env };
  for (const k of Object.keys(env)) if (k.startsWith('DVX_')) delete env[k];
  // --after 0: every event of the org's log from its start, so none is missed while the watch connects.
  const child = spawn(DVX_BIN, ['approvals', 'watch', '--after', '0'], {
    env: { ...env, DVX_BROKER: broker, DVX_TOKEN_FILE: token, DVX_CA_CERT: cli.ca },
    stdio: ['pipe', 'pipe', 'pipe'],
  });
  child.stdin.end();
  const exited = once(child, 'exit');
  const lines: Record<string, unknown>[] = [];
  const waiters: (() => void)[] = [];
  createInterface({ input: child.stdout }).on('line', (l) => {
    lines.push(JSON.parse(l));
    for (const w of waiters.splice(0)) w();
  });
  const until = async (n: number) => {
    while (lines.length < n) await new Promise<void>((r) => waiters.push(r));
  };

  const first = await request();
  const second = await request();
  await request('org-b', 'agent-b');
  const approved = await cli.json('admin-a', ['approvals', 'approve', first, '--reason', 'checked with finance'], {
    broker,
  });
  t.match(approved, { id: first, status: 'approved', reason: 'checked with finance', decided_by: 'admin-a' });
  const denied = await cli.json('admin-a', ['approvals', 'deny', second], { broker });
  t.match(denied, { id: second, status: 'denied' });
  await until(4);
  t.same(
    lines.map((a) => `${a.id} ${a.status}`),
    [`${first} pending`, `${second} pending`, `${first} approved`, `${second} denied`],
    "the org's changes, in order; another org's never",
  );
  child.kill('SIGINT');
  t.equal((await exited)[0], 0, 'Ctrl-C ends the watch cleanly');

  const list = await cli.json('admin-a', ['approvals', 'list', '--status', 'approved'], { broker });
  t.same(
    list.approvals.map((a: { id: string }) => a.id),
    [first],
  );
  const table = await cli.dvx('admin-a', ['approvals', 'list', '--output', 'table'], { broker });
  t.match(table.stdout, /^ID\s+STATUS\s+AGENT_ID\s+TOOL/);
  t.match(await cli.json('admin-a', ['approvals', 'get', second], { broker }), { id: second, status: 'denied' });
  const twice = await cli.dvx('admin-a', ['approvals', 'approve', first], { broker });
  t.equal(twice.code, 6, 'a settled approval is a conflict');
  t.match(twice.stderr, /^dvx: 409 /);
});

t.test('Problem paths and local validation', async (t) => {
  const other = await request('org-b', 'agent-b');
  const r = await cli.dvx('admin-a', ['approvals', 'get', other], { broker });
  t.equal(r.code, 5, "another org's approval is not found");
  t.match(r.stderr, /^dvx: 404 /);
  const pending = await request();
  const refused = await cli.dvx('nobody-a', ['approvals', 'approve', pending], { broker });
  t.equal(refused.code, 4);
  t.match((await b.operator('admin-a', 'GET', `/api/v1/approvals/${pending}`)).body, { status: 'pending' });
  for (const [args, message] of [
    [['approvals', 'get', 'bad/id'], /approval id "bad\/id" must be/],
    [['approvals', 'deny', pending, '--reason', 'bell\u0007'], /--reason must be/],
    [['approvals', 'list', '--status', 'maybe'], /argument 'maybe' is invalid/],
    [['approvals', 'list', '--limit', 'lots'], /--limit must be/],
  ] as [string[], RegExp][]) {
    const bad = await cli.dvx('admin-a', args, { broker: 'https://127.0.0.1:1' });
    t.equal(bad.code, 2, args.join(' '));
    t.match(bad.stderr, message);
  }
  t.match((await b.operator('admin-a', 'GET', `/api/v1/approvals/${pending}`)).body, { status: 'pending' });
});
