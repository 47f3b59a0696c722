import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import t from 'tap';
import { startCpHarness } from '../../fixtures/controlplane-harness.ts';
import { cpUrl, operatorCli } from './operator-cli-fixture.ts';

// dvx policy against a real control plane over TLS and a real OIDC provider: the LLM keys at platform,
// org and agent scope, the governance kinds at every scope (flags, a file, stdin, --clear), locks, an
// agent's effective policy; an invalid value fails locally with exit 2 and the server stays unchanged;
// refusals and absences come back as one Problem line with their exit code.

const h = await startCpHarness(
  [
    { clientId: 'root', org: 'org-a', human: true },
    { clientId: 'nobody', org: 'org-a', human: true },
  ],
  { seedAdmin: ['root'] },
);
t.teardown(() => h.close());
await h.call('root', 'POST', '/orgs', { id: 'org-a', name: 'A' });
await h.call('root', 'POST', '/orgs/org-a/groups', { id: 'ops', name: 'Ops' });
await h.call('root', 'POST', '/orgs/org-a/agents', { uid: 'bot-1', name: 'builder' });
const cli = await operatorCli(t, h.issuer, h.ca, cpUrl(h));

t.test('an LLM key at platform scope from a file: set, get, list, delete', async (t) => {
  const file = join(cli.dir, 'model-policy.json');
  await writeFile(file, JSON.stringify({ mode: 'blocklist', models: ['*-preview'] }));
  const set = await cli.json('root', ['policy', 'set', 'model_policy', '--file', file]);
  t.same(set, { key: 'model_policy', scope: 'platform', locked: false, published: false });
  const got = await cli.json('root', ['policy', 'get', 'model_policy']);
  t.match(got, { key: 'model_policy', scope: 'platform', value: { mode: 'blocklist', models: ['*-preview'] } });
  const list = await cli.json('root', ['policy', 'list']);
  t.ok(list.some((r: { key: string }) => r.key === 'model_policy'));
  const table = await cli.dvx('root', ['policy', 'list', '--output', 'table']);
  t.match(table.stdout, /^KEY\s+SCOPE\s+LOCKED\s+VALUE\n/);
  const del = await cli.dvx('root', ['policy', 'delete', 'model_policy']);
  t.equal(del.code, 0, del.stderr);
  t.equal(del.stdout, '', 'a delete prints nothing on stdout');
  t.match(del.stderr, /deleted model_policy at platform/);
  const gone = await cli.dvx('root', ['policy', 'get', 'model_policy']);
  t.equal(gone.code, 5);
  t.match(gone.stderr, /^dvx: model_policy is not set at platform\n$/);
  const again = await cli.dvx('root', ['policy', 'delete', 'model_policy']);
  t.equal(again.code, 5);
  t.match(again.stderr, /^dvx: 404 .*no model_policy at platform/);
});

t.test("an LLM key at org scope from stdin: the token's org; --org of another org is refused", async (t) => {
  const value = JSON.stringify({ pii_detection: { enabled: true, types: ['email'] } });
  const set = await cli.json(
    'root',
    ['policy', 'set', 'content_inspection', '--scope', 'org', '--org', 'org-a', '--file', '-'],
    {
      stdin: value,
    },
  );
  t.same(set, { key: 'content_inspection', scope: 'org:org-a', locked: false, published: false });
  const stored = (await h.call('root', 'GET', '/config/llmproxy')).body;
  t.match(JSON.parse(stored[0].value), { pii_detection: { enabled: true, types: ['email'] } });
  const other = await cli.dvx('root', ['policy', 'get', 'content_inspection', '--org', 'org-b']);
  t.equal(other.code, 2);
  t.match(other.stderr, /the token's org \(org-a\), not --org org-b/);
  const group = await cli.dvx('root', [
    'policy',
    'get',
    'model_policy',
    '--scope',
    'group',
    '--org',
    'org-a',
    '--group',
    'ops',
  ]);
  t.equal(group.code, 2);
  t.match(group.stderr, /no group scope/);
});

t.test('an LLM key at agent scope; --lock refused there, locally', async (t) => {
  const file = join(cli.dir, 'agent-mp.json');
  await writeFile(file, JSON.stringify({ mode: 'allowlist', models: ['claude-*'] }));
  const locked = await cli.dvx('root', ['policy', 'set', 'model_policy', '--agent', 'bot-1', '--file', file, '--lock']);
  t.equal(locked.code, 2);
  t.match(locked.stderr, /--lock is refused at agent scope/);
  t.same((await h.call('root', 'GET', '/agents/bot-1/config')).body, [], 'nothing sent');
  const set = await cli.json('root', ['policy', 'set', 'model_policy', '--agent', 'bot-1', '--file', file]);
  t.same(set, { key: 'model_policy', scope: 'agent:bot-1', locked: false, published: false });
  const got = await cli.json('root', ['policy', 'get', 'model_policy', '--scope', 'agent', '--agent', 'bot-1']);
  t.match(got.value, { mode: 'allowlist', models: ['claude-*'] });
  const eff = await cli.json('root', ['policy', 'effective', 'bot-1']);
  t.match(eff, { agent: 'bot-1', org_id: 'org-a' });
  t.match(JSON.stringify(eff.policy), /claude-\*/, "the agent's override is in its effective policy");
  const gov = await cli.json('root', ['policy', 'effective', 'bot-1', '--governance']);
  t.match(gov, { agent: 'bot-1', org_id: 'org-a' });
  const del = await cli.dvx('root', ['policy', 'delete', 'model_policy', '--agent', 'bot-1']);
  t.equal(del.code, 0, del.stderr);
  t.same((await h.call('root', 'GET', '/agents/bot-1/config')).body, []);
  const missing = await cli.dvx('root', ['policy', 'effective', 'bot-nope']);
  t.equal(missing.code, 5);
  t.match(missing.stderr, /^dvx: 404 /);
});

t.test("an invalid value: exit 2 with the validator's message, nothing sent, the server unchanged", async (t) => {
  const before = {
    platform: (await h.call('root', 'GET', '/platform/config/llmproxy')).body,
    org: (await h.call('root', 'GET', '/config/llmproxy')).body,
    exec: (await h.call('root', 'GET', '/policies/exec')).status,
  };
  const bad: [string[], string | undefined, RegExp][] = [
    [
      ['policy', 'set', 'model_policy', '--file', '-'],
      '{"mode":"maybe"}',
      /model_policy\.mode: must be "allowlist" or "blocklist"/,
    ],
    [
      ['policy', 'set', 'content_inspection', '--scope', 'org', '--org', 'org-a', '--file', '-'],
      JSON.stringify({ patterns: [{ description: 'x', pattern: '(', severity: 'block' }] }),
      /content_inspection\.patterns\[0\]\.pattern/,
    ],
    [['policy', 'set', 'model_policy', '--file', '-'], '{not json', /is not valid JSON/],
    [['policy', 'set', 'model_policy', '--file', '-'], '', /is empty/],
    [
      ['policy', 'set', 'exec', '--file', '-'],
      '{"enabled":"yes"}',
      /invalid exec policy: enabled: is required \(a boolean\)/,
    ],
    [['policy', 'set', 'tunnel-ports', '--ports', '22,70000'], undefined, /ports\[1\]: must be an integer 1\.\.65535/],
    [
      ['policy', 'set', 'destination', '--file', '-'],
      '{"allow":[{"cidr":"not-a-cidr"}]}',
      /invalid destination policy: allow\[0\]/,
    ],
    [['policy', 'set', 'exec', '--ports', '22'], undefined, /--ports\/--clear is for tunnel-ports/],
    [['policy', 'set', 'nonsense', '--file', '-'], '{}', /unknown policy key "nonsense"/],
    [
      ['policy', 'set', 'exec', '--enable', '--scope', 'group', '--org', 'org-a'],
      undefined,
      /group scope needs --org and --group/,
    ],
  ];
  for (const [args, stdin, message] of bad) {
    // The control plane's URL is unreachable here: anything sent would be exit 3, not 2.
    const r = await cli.dvx('root', args, { stdin, url: 'https://127.0.0.1:1' });
    t.equal(r.code, 2, `${args.join(' ')}: ${r.stderr}`);
    t.match(r.stderr, message);
    t.equal(r.stderr.trim().split('\n').length, 1, 'one line');
  }
  t.same((await h.call('root', 'GET', '/platform/config/llmproxy')).body, before.platform);
  t.same((await h.call('root', 'GET', '/config/llmproxy')).body, before.org);
  t.equal((await h.call('root', 'GET', '/policies/exec')).status, before.exec);
});

t.test('governance kinds: flags, --clear, a file, locks and their 409', async (t) => {
  const exec = await cli.json('root', ['policy', 'set', 'exec', '--enable', '--scope', 'org', '--org', 'org-a']);
  t.same(exec, { key: 'exec', scope: 'org:org-a', locked: false, published: false });
  t.match(await cli.json('root', ['policy', 'get', 'exec', '--org', 'org-a']), { value: { enabled: true } });

  const cleared = await cli.json('root', [
    'policy',
    'set',
    'tunnel-ports',
    '--clear',
    '--org',
    'org-a',
    '--group',
    'ops',
  ]);
  t.match(cleared, { key: 'tunnel_ports', scope: 'group:org-a:ops' });
  t.same((await h.call('root', 'GET', '/policies/tunnel-ports?scope=group&org=org-a&group=ops')).body.value, {
    ports: [],
  });
  await cli.json('root', ['policy', 'set', 'tunnel-ports', '--ports', '443,22', '--agent', 'bot-1']);
  t.same((await h.call('root', 'GET', '/policies/tunnel-ports?scope=agent&agent=bot-1')).body.value, {
    ports: [22, 443],
  });

  const dest = join(cli.dir, 'dest.json');
  await writeFile(dest, JSON.stringify({ allow: [{ host: 'api.example.com', port: 443 }], deny: [] }));
  await cli.json('root', ['policy', 'set', 'destination', '--file', dest, '--lock']);
  t.match((await h.call('root', 'GET', '/policies/destination')).body, { locked: true });
  const below = await cli.dvx('root', ['policy', 'set', 'destination', '--file', dest, '--org', 'org-a']);
  t.equal(below.code, 6, 'a lock at a broader scope is a conflict');
  t.match(below.stderr, /^dvx: 409 .*locked at platform/);

  await cli.json('root', ['policy', 'set', 'llm', '--allow', 'claude-*', '--deny', '*-preview']);
  t.match((await h.call('root', 'GET', '/policies/llm')).body.value, {
    models: { allow: ['claude-*'], deny: ['*-preview'] },
  });

  const list = await cli.json('root', ['policy', 'list', '--org', 'org-a']);
  t.same(
    list.map((r: { key: string }) => r.key),
    ['content_inspection', 'exec'],
  );
  const groupList = await cli.json('root', ['policy', 'list', '--org', 'org-a', '--group', 'ops']);
  t.same(
    groupList.map((r: { key: string }) => r.key),
    ['tunnel_ports'],
  );
  const del = await cli.dvx('root', ['policy', 'delete', 'exec', '--org', 'org-a']);
  t.equal(del.code, 0, del.stderr);
  t.equal((await h.call('root', 'GET', '/policies/exec?scope=org&org=org-a')).status, 404);
  const noGroup = await cli.dvx('root', ['policy', 'get', 'exec', '--org', 'org-a', '--group', 'nope']);
  t.equal(noGroup.code, 5);
  t.match(noGroup.stderr, /^dvx: 404 .*no group nope/);
});

t.test('a caller without the capability: one Problem line, exit 4', async (t) => {
  const r = await cli.dvx('nobody', ['policy', 'get', 'exec']);
  t.equal(r.code, 4);
  t.match(r.stderr, /^dvx: 403 /);
  t.equal(r.stderr.trim().split('\n').length, 1);
  const w = await cli.dvx('nobody', ['policy', 'set', 'ssh', '--disable']);
  t.equal(w.code, 4);
  t.equal((await h.call('root', 'GET', '/policies/ssh')).status, 404, 'nothing written');
});
