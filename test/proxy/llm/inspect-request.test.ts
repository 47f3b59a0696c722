import t from 'tap';
import { readFile, rename, writeFile } from 'node:fs/promises';
import { Readable } from 'node:stream';
import { request } from 'undici';
import { until } from '../../fixtures/eventually.ts';
import { AGENT_SECRET, anthropicBody, baseSnapshot, post, startHarness } from '../../fixtures/llmproxy-harness.ts';

// The inspect-request step and what it reads: the org's flags, the policy snapshot and the secrets
// file, each followed as it is rewritten, and fail-closed inspection.
const h = await startHarness();
t.teardown(() => h.close());

t.test('flags: inspect:llm off skips inspection, audit:llm off writes no record', async (t) => {
  const snapshot = baseSnapshot(h.upstream.url) as { orgs: Record<string, { flags: Record<string, boolean> }> };
  snapshot.orgs['org-1'].flags = { 'inspect:llm': false, 'audit:llm': false };
  await h.writeSnapshot(snapshot);
  const before = h.audit.length;
  const r = await post(h, '/v1/messages', anthropicBody(`pw ${AGENT_SECRET}`));
  t.equal(r.status, 200, 'not inspected');
  // The call is over: a record, had there been one, would have been appended by now.
  await until(() => h.proxy.proxy.inFlight === 0);
  t.equal(h.audit.length, before, 'not audited');
  await h.writeSnapshot(baseSnapshot(h.upstream.url));
  t.equal(
    (await post(h, '/v1/messages', anthropicBody(`pw ${AGENT_SECRET}`))).status,
    403,
    'back on after the next reload',
  );
});

t.test('a snapshot reload takes effect at once; a bad snapshot is refused whole', async (t) => {
  const snapshot = baseSnapshot(h.upstream.url) as { platform: Record<string, unknown> };
  snapshot.platform.model_policy = { value: { mode: 'allowlist', models: ['claude-haiku-*'] }, locked: true };
  await h.writeSnapshot(snapshot);
  t.equal((await post(h, '/v1/messages', anthropicBody('hi'))).status, 403, 'the locked platform allowlist applies');
  t.match(h.audit.at(-1), { findings: [{ inspector_type: 'model_restriction', location: 'model' }] });
  await h.writeSnapshot({ ...snapshot, platform: { model_policy: { value: { mode: 'sometimes' } } } });
  t.ok(
    h.logs.some(
      (l) =>
        /policy snapshot reload refused/.test(String(l.msg)) &&
        /model_policy\.value\.mode/.test(String((l.err as { message?: string } | undefined)?.message)),
    ),
    'the error names the field',
  );
  t.equal((await post(h, '/v1/messages', anthropicBody('hi'))).status, 403, 'the last good snapshot stays');
  await h.writeSnapshot(baseSnapshot(h.upstream.url));
});

t.test('a call that began before a reload does not put the old policy back for the calls after it', async (t) => {
  // The policy is resolved from the snapshot a call read when it began, after its body has arrived. A
  // call begun before a reload resolves after the reload has emptied the policy cache: what it resolves
  // must not be what the next calls find there.
  await h.writeSnapshot(baseSnapshot(h.upstream.url));
  const body = Buffer.from(anthropicBody('hi'));
  let release!: () => void;
  const released = new Promise<void>((resolve) => (release = resolve));
  async function* slowBody() {
    yield body.subarray(0, 20);
    await released;
    yield body.subarray(20);
  }
  const first = request(`${h.url}/v1/messages`, {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      'content-length': String(body.length),
      'x-api-key': await h.issuer.mint({}),
    },
    body: Readable.from(slowBody()),
    dispatcher: h.dispatcher,
  });
  t.ok(await until(() => h.proxy.proxy.inFlight === 1), 'the first call is in flight, its body half sent');
  const blocking = baseSnapshot(h.upstream.url) as { platform: Record<string, unknown> };
  blocking.platform.model_policy = { value: { mode: 'blocklist', models: ['claude-sonnet-4-5'] } };
  await h.writeSnapshot(blocking);
  release();
  const answer = await first;
  await answer.body.text();
  t.equal(answer.statusCode, 200, 'the call begun before the reload keeps the snapshot it began with');
  t.equal((await post(h, '/v1/messages', body)).status, 403, 'the next call is judged by the new snapshot');
  await h.writeSnapshot(baseSnapshot(h.upstream.url));
});

t.test("an agent the snapshot does not list is judged by its token's group, each group on its own", async (t) => {
  const snapshot = baseSnapshot(h.upstream.url) as {
    orgs: Record<string, { groups: Record<string, unknown> }>;
  };
  snapshot.orgs['org-1'].groups = {
    'g-block': { config: { model_policy: { value: { mode: 'blocklist', models: ['claude-sonnet-4-5'] } } } },
  };
  await h.writeSnapshot(snapshot);
  const as = (group: string) => ({ sub: 'unlisted-agent', org_id: 'org-1', group_id: group });
  // No credential is configured for it: a call its policy lets through ends at the credential step (500).
  t.not((await post(h, '/v1/messages', anthropicBody('hi'), {}, as('g-open'))).status, 403, 'its own group');
  t.equal(
    (await post(h, '/v1/messages', anthropicBody('hi'), {}, as('g-block'))).status,
    403,
    "another group of the same agent is not served the first one's cached policy",
  );
  await h.writeSnapshot(baseSnapshot(h.upstream.url));
});

t.test('the secrets filter follows a rewritten secrets file', async (t) => {
  const path = `${h.dir}/secrets.json`;
  const original = await readFile(path, 'utf8');
  const rotated = 'rotated-secret-value-0042';
  const reloads = () => h.logs.filter((l) => l.msg === 'secrets file reloaded').length;
  let seen = reloads();
  await writeFile(
    `${path}.tmp`,
    JSON.stringify({
      ...JSON.parse(original),
      'agent:agent-1': { ...JSON.parse(original)['agent:agent-1'], db_password: rotated },
    }),
  );
  await rename(`${path}.tmp`, path);
  t.ok(await until(() => reloads() > seen), 'the proxy reloaded the secrets file');
  seen = reloads();
  t.equal((await post(h, '/v1/messages', anthropicBody(`pw ${rotated}`))).status, 403, 'the new value is a needle');
  t.equal(
    (await post(h, '/v1/messages', anthropicBody(`pw ${AGENT_SECRET}`))).status,
    200,
    'the old one is not any more',
  );
  await writeFile(`${path}.tmp`, original);
  await rename(`${path}.tmp`, path);
  t.ok(await until(() => reloads() > seen), 'and reloaded it again');
  t.equal((await post(h, '/v1/messages', anthropicBody(`pw ${AGENT_SECRET}`))).status, 403, 'and back');
});

t.test('fail closed: inspection that cannot finish in time is a 503', async (t) => {
  // A worker that never finishes (HANG-WORKER): a scan that merely takes long is not proof on a loaded
  // machine, where its start and its result can reach the main thread together (the deadline runs from
  // the worker's start, so a scan that did finish is used).
  const hanging = new URL('../../fixtures/faulty-worker.ts', import.meta.url);
  const f = await startHarness({ proxy: { inspectTimeout: 200, inspectFailClosed: true }, inspectWorker: hanging });
  t.teardown(() => f.close());
  const big = anthropicBody(`HANG-WORKER ${'x'.repeat(4 * 1024 * 1024)}`);
  const r = await post(f, '/v1/messages', big);
  t.equal(r.status, 503);
  t.same(JSON.parse(r.text), {
    type: 'error',
    error: {
      type: 'content_inspection_unavailable',
      message: 'Request rejected: content security inspection is unavailable.',
    },
  });
  const open = await startHarness({ proxy: { inspectTimeout: 200 }, inspectWorker: hanging });
  t.teardown(() => open.close());
  const passed = await post(open, '/v1/messages', big);
  t.equal(passed.status, 200, 'fail open by default');
  t.match(open.audit.at(-1), { inspection_failopen: true });
  t.ok(open.logs.some((l) => l.msg === 'inspection failopen'));
});
