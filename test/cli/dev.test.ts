import t from 'tap';
import { spawn } from 'node:child_process';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Agent, request } from 'undici';
import { DVX_BIN, runDvx } from '../fixtures/run-dvx.ts';
import { startLlmUpstream } from '../fixtures/llm-upstream.ts';

// The first run: `dvx dev` (what `npm start` runs) creates its material, prints a working token and
// serves; SIGTERM stops it cleanly.
t.test('dvx dev serves on embedded defaults with a printed token', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'dvx-dev-'));
  const upstream = await startLlmUpstream();
  t.teardown(async () => {
    await upstream.close();
    await rm(dir, { recursive: true, force: true });
  });
  const child = spawn(DVX_BIN, ['dev', '--dir', dir, '--addr', '127.0.0.1:0', '--upstream-default', upstream.url], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let err = '';
  child.stderr.on('data', (d) => (err += d));
  const exited = new Promise<number | null>((r) => child.on('close', r));
  for (let i = 0; i < 150 && !/agent token/.test(err); i++) await new Promise((r) => setTimeout(r, 100));
  const url = /llmproxy on (https:\/\/127\.0\.0\.1:\d+)/.exec(err)?.[1];
  const token = /\n(eyJ[^\s]+)\n/.exec(err)?.[1];
  t.ok(url && token, 'prints the URL and a token');
  const dispatcher = new Agent({ connect: { ca: await readFile(join(dir, 'ca.pem')) } });
  t.teardown(() => dispatcher.close());
  const res = await request(`${url}/v1/messages`, {
    method: 'POST',
    dispatcher,
    headers: { 'x-api-key': token!, 'content-type': 'application/json', 'anthropic-version': '2023-06-01' },
    body: JSON.stringify({ model: 'claude-sonnet-4-5', max_tokens: 8, messages: [{ role: 'user', content: 'hi' }] }),
  });
  t.equal(res.statusCode, 200, await res.body.text());
  t.equal(
    upstream.received.at(-1)!.headers['x-api-key'],
    'sk-ant-replace-with-your-key',
    'the secrets file key was injected',
  );
  const blocked = await request(`${url}/v1/messages`, {
    method: 'POST',
    dispatcher,
    headers: { 'x-api-key': token!, 'content-type': 'application/json' },
    body: JSON.stringify({
      model: 'claude-sonnet-4-5',
      max_tokens: 8,
      messages: [{ role: 'user', content: 'Project Nightingale ships Friday' }],
    }),
  });
  t.equal(blocked.statusCode, 403, 'the example policy is live');
  await blocked.body.text();
  const minted = await runDvx(['dev', '--dir', dir, 'token', '--agent', 'agent-dev']);
  t.equal(minted.code, 0);
  const again = await request(`${url}/v1/models`, {
    dispatcher,
    headers: { 'x-api-key': minted.stdout.trim(), 'anthropic-version': '2023-06-01' },
  });
  t.equal(again.statusCode, 200, 'a minted token works');
  await again.body.text();
  child.kill('SIGTERM');
  t.equal(await exited, 0, 'stops cleanly on SIGTERM');
});
