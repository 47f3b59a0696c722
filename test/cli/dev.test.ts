import t, { type Test } from 'tap';
import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtemp, readFile, rm, stat } from 'node:fs/promises';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { Agent, fetch as undiciFetch } from 'undici';
import { DevApi } from '../../cli/dev/dev-api.ts';
import { MOCK_LABEL } from '../../cli/dev/mock-upstream.ts';
import { DEV_AUDIENCE } from '../../cli/dev/oidc-issuer.ts';
import { until } from '../fixtures/eventually.ts';
import { DVX_BIN, runDvx } from '../fixtures/run-dvx.ts';

// `dvx dev` (what `npm start` runs) as a user runs it: the real CLI as a child process, from a fresh
// state directory, every address on port 0, read back from .dvx/dev.json. The official SDKs call
// llmproxy with the demo agent's token and the mock upstream answers; the demo org's example policy
// blocks a call (403); `dvx whoami` works at once through the profile it wrote; SIGINT leaves no process
// and no listener behind; a second start reuses the state (same CA, same objects, none duplicated).

t.setTimeout(300_000);

const REQUIRED = [
  'controlplane',
  'broker',
  'llmproxy',
  'gateway',
  'approvals_page',
  'ca_cert',
  'agent_token',
  'profile',
] as const;

const work = await mkdtemp(join(tmpdir(), 'dvx-dev-test-'));
t.teardown(() => rm(work, { recursive: true, force: true }));
const dir = join(work, '.dvx');
const xdg = join(work, 'config');
const env: Record<string, string> = { XDG_CONFIG_HOME: xdg };
const children = new Set<ChildProcess>();
t.teardown(() => {
  // A test that failed half-way: its dvx dev goes with its whole group.
  for (const c of children) if (c.exitCode === null && c.pid) process.kill(-c.pid, 'SIGKILL');
});

interface Run {
  child: ChildProcess;
  stdout: () => string;
  stderr: () => string;
  exited: Promise<number | null>;
  facts: Record<string, string>;
}

/** Starts `dvx dev` in its own process group, with no provider key, and waits for its dev.json. */
async function startDev(): Promise<Run> {
  const childEnv = { ...process.env, ...env };
  for (const k of Object.keys(childEnv))
    if (k.startsWith('DVX_') || k === 'ANTHROPIC_API_KEY' || k === 'OPENAI_API_KEY') delete childEnv[k];
  const args = ['dev', '--dir', dir, '--log-level', 'error'];
  for (const a of ['controlplane', 'broker', 'broker-operator', 'llmproxy', 'gateway', 'issuer', 'upstream'])
    args.push(`--${a}-addr`, '127.0.0.1:0');
  const child = spawn(DVX_BIN, args, { env: childEnv, stdio: ['ignore', 'pipe', 'pipe'], detached: true });
  children.add(child);
  let out = '';
  let err = '';
  child.stdout!.on('data', (d) => (out += d));
  child.stderr!.on('data', (d) => (err += d));
  const exited = new Promise<number | null>((r) => child.on('close', r));
  let gone = false;
  void exited.then(() => (gone = true));
  const ready = await until(async () => gone || (await stat(join(dir, 'dev.json')).then(() => true)), 180_000, 200);
  if (!ready || gone) throw new Error(`dvx dev did not start:\n${out}\n${err}`);
  const facts = JSON.parse(await readFile(join(dir, 'dev.json'), 'utf8'));
  return { child, stdout: () => out, stderr: () => err, exited, facts };
}

/** undici's fetch trusting the dev CA, for the SDKs. */
function fetchTrusting(ca: string) {
  const dispatcher = new Agent({ connect: { ca } });
  const f = Object.assign(
    (input: string | URL, init?: RequestInit) =>
      undiciFetch(input as string, { ...(init as object), dispatcher } as never),
    { Response },
  ) as unknown as typeof globalThis.fetch;
  return { fetch: f, close: () => dispatcher.close() };
}

const refused = (port: number) =>
  new Promise<boolean>((resolve) => {
    const s = net.connect(port, '127.0.0.1');
    s.once('connect', () => {
      s.destroy();
      resolve(false);
    });
    s.once('error', () => resolve(true));
  });

/** SIGINT to dvx dev; it exits 0, its group is empty and none of its listeners answers. */
async function stopDev(t: Test, run: Run): Promise<void> {
  const ports = [run.facts.controlplane, run.facts.broker, run.facts.broker_operator, run.facts.llmproxy]
    .concat([run.facts.gateway, run.facts.issuer])
    .map((u) => Number(new URL(u).port));
  run.child.kill('SIGINT');
  t.equal(await run.exited, 0, 'exits 0 on SIGINT');
  children.delete(run.child);
  t.throws(() => process.kill(-run.child.pid!, 0), { code: 'ESRCH' }, 'no process left in its group');
  for (const port of ports) t.ok(await refused(port), `port ${port} is closed`);
  await t.rejects(stat(join(dir, 'dev.json')), { code: 'ENOENT' }, 'dev.json goes with it');
  await t.rejects(stat(join(dir, 'dev.lock')), { code: 'ENOENT' }, 'and its lock');
}

async function sdkCalls(t: Test, facts: Record<string, string>) {
  const ca = await readFile(facts.ca_cert, 'utf8');
  const { fetch, close } = fetchTrusting(ca);
  t.teardown(close);
  const anthropic = new Anthropic({ apiKey: facts.agent_token, baseURL: facts.llmproxy, fetch, maxRetries: 0 });
  const message = await anthropic.messages.create({
    model: 'claude-dev-mock',
    max_tokens: 64,
    messages: [{ role: 'user', content: 'hello from the test' }],
  });
  const text = message.content[0]?.type === 'text' ? message.content[0].text : '';
  t.ok(text.startsWith(MOCK_LABEL), `the mock upstream answered, labelled: ${text}`);
  t.match(text, /hello from the test/);

  let streamed = '';
  const stream = anthropic.messages.stream({
    model: 'claude-dev-mock',
    max_tokens: 64,
    messages: [{ role: 'user', content: 'stream it' }],
  });
  stream.on('text', (d) => (streamed += d));
  await stream.finalMessage();
  t.ok(streamed.startsWith(MOCK_LABEL) && streamed.includes('stream it'), 'streamed through llmproxy');

  const openai = new OpenAI({ apiKey: facts.agent_token, baseURL: `${facts.llmproxy}/v1`, fetch, maxRetries: 0 });
  const chat = await openai.chat.completions.create({
    model: 'gpt-4o-mini',
    messages: [{ role: 'user', content: 'openai too' }],
  });
  t.ok(chat.choices[0]?.message.content?.startsWith(MOCK_LABEL), 'OpenAI Chat Completions too');
  const response = await openai.responses.create({ model: 'gpt-4o-mini', input: 'responses as well' });
  t.ok(response.output_text.startsWith(MOCK_LABEL), 'OpenAI Responses too');
  let streamedResponse = '';
  for await (const event of await openai.responses.create({ model: 'gpt-4o-mini', input: 'a stream', stream: true }))
    if (event.type === 'response.output_text.delta') streamedResponse += event.delta;
  t.match(streamedResponse, /a stream/, 'a streamed Response too');

  const blocked = await anthropic.messages
    .create({
      model: 'claude-dev-mock',
      max_tokens: 64,
      messages: [{ role: 'user', content: `${facts.blocked_example} ships on Friday` }],
    })
    .then(
      () => 200,
      (err: { status?: number }) => err.status,
    );
  t.equal(blocked, 403, "the demo org's example policy blocks the pattern");
}

let first: Record<string, string> = {};
let caPem = '';

t.test('a first start from a fresh directory', async (t) => {
  const run = await startDev();
  first = run.facts;
  for (const key of REQUIRED) t.ok(run.facts[key], `dev.json has ${key}`);
  t.match(run.facts.agent_token, /^ey[\w-]+\.[\w-]+\.[\w-]+$/, 'the agent token is a JWT');
  t.equal(run.facts.profile, 'dev');
  t.match(run.facts.approvals_page, /^https:\/\/127\.0\.0\.1:\d+\/approvals$/);
  t.equal((await stat(join(dir, 'dev.json'))).mode & 0o777, 0o600, 'dev.json is private (it holds a token)');
  caPem = await readFile(run.facts.ca_cert, 'utf8');
  t.match(run.stdout(), MOCK_LABEL, 'the banner says the upstream is the mock');
  t.match(run.stdout(), run.facts.llmproxy);

  await t.test('the SDKs get 200 from the mock upstream; the blocked pattern 403', (t) => sdkCalls(t, run.facts));

  await t.test('dvx whoami works at once through the dev profile', async (t) => {
    const who = await runDvx(['whoami', '--output', 'json'], { env });
    t.equal(who.code, 0, who.stderr);
    t.match(JSON.parse(who.stdout), { subject: 'dvx-dev-admin', org_id: 'demo' });
    t.ok(JSON.parse(who.stdout).capabilities.includes('platform:config'), 'the dev admin is platform admin');
    const profiles = JSON.parse(await readFile(join(xdg, 'dvx', 'config.json'), 'utf8'));
    t.equal(profiles.default_profile, 'dev', 'the default, as there was none');
  });

  await t.test("dvx policy and dvx audit work against it; the enclave store holds the agent's calls", async (t) => {
    const policy = await runDvx(['policy', 'get', 'content_inspection', '--scope', 'org', '--org', 'demo'], { env });
    t.equal(policy.code, 0, policy.stderr);
    t.match(JSON.parse(policy.stdout), { key: 'content_inspection', value: { patterns: [{ severity: 'block' }] } });
    const changes = await runDvx(['audit', 'list', '--action', 'org.create', '--output', 'json'], { env });
    t.equal(changes.code, 0, changes.stderr);
    t.match(JSON.parse(changes.stdout), { records: [{ action: 'org.create', actor: 'dvx-dev-admin' }] });
    // The broker's audit routes read the enclave's store, which llmproxy ships into: the SDK calls above.
    let calls: { action: string; outcome: string }[] = [];
    t.ok(
      await until(
        async () => {
          const r = await runDvx(
            ['audit', 'list', '--local', '--agent', 'demo-agent', '--action', 'inference.request', '--output', 'jsonl'],
            { env },
          );
          calls = r.stdout
            .trim()
            .split('\n')
            .filter(Boolean)
            .map((l) => JSON.parse(l));
          return calls.length > 0;
        },
        60_000,
        1000,
      ),
      "the agent's LLM calls are in the enclave audit",
    );
  });

  await t.test('dvx dev token prints the current token', async (t) => {
    const token = await runDvx(['dev', '--dir', dir, 'token'], { env });
    t.equal(token.code, 0, token.stderr);
    const facts = JSON.parse(await readFile(join(dir, 'dev.json'), 'utf8'));
    t.equal(token.stdout.trim(), facts.agent_token);
  });

  await t.test('a second dvx dev on the same directory is refused and leaves the running one whole', async (t) => {
    const before = await readFile(join(dir, 'dev.json'), 'utf8');
    const args = ['dev', '--dir', dir, '--log-level', 'error'];
    for (const a of ['controlplane', 'broker', 'broker-operator', 'llmproxy', 'gateway', 'issuer', 'upstream'])
      args.push(`--${a}-addr`, '127.0.0.1:0');
    const second = await runDvx(args, { env });
    t.not(second.code, 0);
    t.match(second.stderr, new RegExp(`in use by a running dvx dev \\(pid ${run.child.pid}\\)`));
    t.equal(await readFile(join(dir, 'dev.json'), 'utf8'), before, "the running one's dev.json is untouched");
    const who = await runDvx(['whoami', '--output', 'json'], { env });
    t.equal(who.code, 0, who.stderr);
  });

  await t.test('SIGINT stops everything', (t) => stopDev(t, run));
});

t.test('a second start reuses .dvx: same CA, same objects, none duplicated', async (t) => {
  const run = await startDev();
  t.equal(await readFile(run.facts.ca_cert, 'utf8'), caPem, 'the same CA');
  t.equal(run.facts.ca_cert, first.ca_cert);
  await t.test('the agent still calls', (t) => sdkCalls(t, run.facts));

  const api = new DevApi({
    ca: caPem,
    keyFile: join(dir, 'oidc', 'dev-admin-key.json'),
    issuer: run.facts.issuer,
    audience: DEV_AUDIENCE,
  });
  t.teardown(() => api.close());
  const cp = (path: string) => `${run.facts.controlplane}/api/v1${path}`;
  const orgs = await api.call('GET', cp('/orgs'));
  t.equal(orgs.status, 200);
  t.same(
    orgs.body.map((o: { id: string }) => o.id),
    ['demo'],
    'one demo org',
  );
  const agents = await api.call('GET', cp('/orgs/demo/agents'));
  t.equal(agents.status, 200);
  const list = Array.isArray(agents.body) ? agents.body : agents.body.agents;
  t.equal(list.filter((a: { uid?: string; id?: string }) => (a.uid ?? a.id) === 'demo-agent').length, 1, 'one agent');
  const enclaves = await api.call('GET', cp('/enclaves'));
  t.same(
    enclaves.body.map((e: { enclave_id: string }) => e.enclave_id),
    ['dev'],
    'one enclave',
  );
  const who = await runDvx(['whoami', '--output', 'json'], { env });
  t.equal(who.code, 0, `whoami against the second start: ${who.stderr}`);

  await t.test('SIGINT stops everything again', (t) => stopDev(t, run));
});
