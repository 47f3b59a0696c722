import { access, mkdtemp, rm } from 'node:fs/promises';
import { createServer, type AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { runDvx } from '../fixtures/run-dvx.ts';

// `dvx dev` (what `npm start` runs) on a machine where one of its ports is taken: one line naming the
// listener, its flag and its env variable, exit 2, and nothing left behind (before, a stack trace and
// "unexpected error", exit 70).

const work = await mkdtemp(join(tmpdir(), 'dvx-dev-start-failure-'));
const held = createServer().listen(0, '127.0.0.1');
await new Promise((r) => held.once('listening', r));
t.teardown(async () => {
  held.close();
  await rm(work, { recursive: true, force: true });
});
const port = (held.address() as AddressInfo).port;
const free = ['--upstream', 'mock', '--log-level', 'error'];
for (const f of ['issuer', 'controlplane', 'broker', 'broker-operator', 'upstream', 'gateway', 'llmproxy'])
  free.push(`--${f}-addr`, '127.0.0.1:0');

for (const [flag, env] of [
  ['--llmproxy-addr', 'DVX_LLMPROXY_ADDR'],
  ['--controlplane-addr', 'DVX_CONTROLPLANE_ADDR'],
] as const) {
  t.test(`a port in use at ${flag}`, async (t) => {
    const dir = join(work, flag.slice(2));
    const r = await runDvx(['dev', '--dir', dir, ...free, flag, `127.0.0.1:${port}`]);
    t.equal(r.code, 2, r.stderr);
    t.match(
      r.stderr,
      `dvx: dev failed to start: cannot listen on 127.0.0.1:${port} (${flag}): the address is in use`,
      'names the address and the listener',
    );
    t.match(r.stderr, `choose another with ${flag} or ${env}`, 'says how to move it');
    t.notMatch(r.stderr, /unexpected error|\n\s+at /, 'no stack trace');
    await t.rejects(access(join(dir, 'dev.lock')), 'the directory is released');
    await t.rejects(access(join(dir, 'dev.json')), 'no dev.json names a system that is not running');
  });
}
