import { access, mkdtemp, rm } from 'node:fs/promises';
import { createServer, type AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { startFailure } from '../../cli/dev.ts';
import { DevStartError } from '../../cli/errors.ts';
import { freePort } from '../fixtures/free-port.ts';
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

t.test('two of its own listeners given one address: the one that failed is named, and the other', async (t) => {
  const dir = join(work, 'pair');
  const shared = await freePort();
  const r = await runDvx([
    'dev',
    '--dir',
    dir,
    ...free,
    '--controlplane-addr',
    `127.0.0.1:${shared}`,
    '--broker-addr',
    `127.0.0.1:${shared}`,
  ]);
  t.equal(r.code, 2, r.stderr);
  t.match(
    r.stderr,
    `cannot listen on 127.0.0.1:${shared} (--broker-addr): the address is in use (--controlplane-addr names the same port); choose another with --broker-addr or DVX_BROKER_ADDR`,
    'the broker started second and failed; the control plane listened',
  );
  await t.rejects(access(join(dir, 'dev.lock')), 'the directory is released');
});

t.test('what a failed start says, from the error it got', async (t) => {
  const flags = {
    controlplaneAddr: '127.0.0.1:8443',
    brokerAddr: '127.0.0.1:8450',
    brokerOperatorAddr: '127.0.0.1:8451',
    llmproxyAddr: 'localhost:8480',
    gatewayAddr: ':8460',
    issuerAddr: '[::1]:8455',
    upstreamAddr: '127.0.0.1:8490',
  };
  const listenError = (code: string, address: string, port: number) =>
    Object.assign(new Error(`listen ${code}: ${address}:${port}`), { code, address, port });
  t.equal(
    startFailure(new DevStartError(['llmproxyAddr'], listenError('EADDRINUSE', '127.0.0.1', 8480)), flags),
    'cannot listen on 127.0.0.1:8480 (--llmproxy-addr): the address is in use (another dvx dev, or another program); choose another with --llmproxy-addr or DVX_LLMPROXY_ADDR',
    'a host name the flag gives (localhost) and the address it resolved to',
  );
  t.equal(
    startFailure(
      new DevStartError(['brokerAddr', 'brokerOperatorAddr'], listenError('EADDRINUSE', '127.0.0.1', 8451)),
      flags,
    ),
    'cannot listen on 127.0.0.1:8451 (--broker-operator-addr): the address is in use (another dvx dev, or another program); choose another with --broker-operator-addr or DVX_BROKER_OPERATOR_ADDR',
    "of the broker's two listeners, the one whose port it is",
  );
  t.match(
    startFailure(new DevStartError(['issuerAddr'], listenError('EACCES', '::1', 8455)), flags),
    /^cannot listen on \[::1\]:8455 \(--issuer-addr\): listening there is not permitted/,
    'an IPv6 address in brackets',
  );
  t.match(
    startFailure(new DevStartError(['gatewayAddr'], listenError('EADDRNOTAVAIL', '::', 8460)), flags),
    /^cannot listen on \[::\]:8460 \(--gateway-addr\): the address is not on this machine/,
  );
  const wrapped = new Error('gateway: worker 1 failed', { cause: listenError('EADDRINUSE', '127.0.0.1', 8460) });
  t.match(
    startFailure(new DevStartError(['gatewayAddr'], wrapped), flags),
    /\(--gateway-addr\)/,
    'found along the causes',
  );
  t.equal(
    startFailure(listenError('EADDRINUSE', '127.0.0.1', 9999), flags),
    'cannot listen on 127.0.0.1:9999: listen EADDRINUSE: 127.0.0.1:9999',
    'untagged: no flag guessed',
  );
  const a = new Error('a');
  const b = new Error('b', { cause: a });
  (a as { cause?: unknown }).cause = b;
  t.equal(startFailure(a, flags), 'a', 'a cycle of causes ends');
  t.equal(startFailure('a string was thrown', flags), 'a string was thrown', 'not an Error');
  t.equal(startFailure(new DevStartError(['issuerAddr'], 42), flags), '42', 'a tagged non-Error');
});
