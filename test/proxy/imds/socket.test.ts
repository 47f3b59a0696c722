import t from 'tap';
import { execFile } from 'node:child_process';
import { chmod, lstat, mkdir, stat, writeFile } from 'node:fs/promises';
import { createConnection, createServer, type Server } from 'node:net';
import { join } from 'node:path';
import { ImdsSocketError } from '../../../proxy/imds/errors.ts';
import { startImds } from '../../../proxy/imds/server.ts';
import { createLogger } from '../../../core/logger.ts';
import { createRegistry } from '../../../core/metrics.ts';
import { until } from '../../fixtures/eventually.ts';
import { capturingSink, curl, get, startHarness, tempDir } from './imds-fixture.ts';

// The socket: its directory made, its mode set, a stale one (a crashed imds) replaced, a live one or a
// file that is not a socket never touched, and the socket removed when imds stops.

const quiet = () => ({
  logger: createLogger({ level: 'error', destination: { write: () => {} } }),
  registry: createRegistry(),
  audit: capturingSink([]),
});

t.test('the directory is made, the socket gets --imds-socket-mode, and is removed on close', async (t) => {
  const h = await startHarness(t);
  t.equal((await stat(join(h.dir, 'run'))).mode & 0o777, 0o755, 'the directory, 0755');
  const s = await lstat(h.socket);
  t.ok(s.isSocket());
  t.equal(s.mode & 0o777, 0o660, 'the default mode 0660');
  await h.close();
  await t.rejects(lstat(h.socket), { code: 'ENOENT' }, 'removed on close');

  const dir = await tempDir(t);
  const socket = join(dir, 'nested', 'deeper', 'imds.sock');
  const imds = await startImds({ imdsSocket: socket, agentId: 'agent-1', imdsSocketMode: 0o600 }, quiet());
  t.teardown(() => imds.close());
  t.equal((await lstat(socket)).mode & 0o777, 0o600, 'the mode asked for');
  t.equal((await curl(socket, '/healthz')).status, 200);
});

t.test('a stale socket (nothing answers on it) is replaced', async (t) => {
  const dir = await tempDir(t);
  const socket = join(dir, 'imds.sock');
  // A socket file whose server is gone: bound, then its handle closed without unlinking (as after a
  // kill -9). Node removes the file on close, so the test re-creates it by binding and exiting a child.
  const code = `require('net').createServer().listen(${JSON.stringify(socket)}, () => process.kill(process.pid, 'SIGKILL'))`;
  await new Promise<void>((resolve) => execFile(process.execPath, ['-e', code], () => resolve()));
  t.ok((await lstat(socket)).isSocket(), 'a socket file is left behind');
  const logs: string[] = [];
  const imds = await startImds(
    { imdsSocket: socket, agentId: 'agent-1' },
    { ...quiet(), logger: createLogger({ level: 'info', destination: { write: (s: string) => void logs.push(s) } }) },
  );
  t.teardown(() => imds.close());
  t.same((await get(socket, '/healthz')).json, { status: 'ok' }, 'served');
  t.ok(
    logs.some((l) => l.includes('stale imds socket removed')),
    'and said so',
  );
});

t.test('a live socket is refused and left alone; so is a file that is not a socket', async (t) => {
  const first = await startHarness(t);
  await t.rejects(
    startImds({ imdsSocket: first.socket, agentId: 'agent-2' }, quiet()),
    { name: 'ImdsSocketError', code: 'DVX_IMDS_SOCKET', message: /another server answers/ },
    'a second imds on the same socket',
  );
  t.same((await get(first.socket, '/healthz')).json, { status: 'ok' }, 'the first still serves');
  t.equal((await get(first.socket, '/v1/config')).json.agent_id, 'agent-1', 'as itself');

  // Any other live server is left alone too.
  const dir = await tempDir(t);
  const other = join(dir, 'other.sock');
  const server: Server = createServer((c) => c.end());
  await new Promise<void>((r) => server.listen(other, () => r()));
  t.teardown(() => new Promise<void>((r) => server.close(() => r())));
  await t.rejects(startImds({ imdsSocket: other, agentId: 'agent-1' }, quiet()), ImdsSocketError);
  t.ok((await lstat(other)).isSocket(), 'not removed');

  const file = join(dir, 'file.sock');
  await writeFile(file, 'not a socket');
  await t.rejects(startImds({ imdsSocket: file, agentId: 'agent-1' }, quiet()), {
    code: 'DVX_IMDS_SOCKET',
    message: /exists and is not a socket/,
  });
  t.ok((await lstat(file)).isFile(), 'the file is left');

  const asDir = join(dir, 'a-directory');
  await mkdir(asDir);
  await t.rejects(startImds({ imdsSocket: asDir, agentId: 'agent-1' }, quiet()), { code: 'DVX_IMDS_SOCKET' });

  // A directory every local user may write to: anyone could swap the socket. With the sticky bit (as
  // /tmp), no one but its owner can remove it.
  const open = join(dir, 'open');
  await mkdir(open);
  await chmod(open, 0o777);
  await t.rejects(startImds({ imdsSocket: join(open, 'imds.sock'), agentId: 'agent-1' }, quiet()), {
    code: 'DVX_IMDS_SOCKET',
    message: /writable by every local user/,
  });
  await chmod(open, 0o1777);
  const sticky = await startImds({ imdsSocket: join(open, 'imds.sock'), agentId: 'agent-1' }, quiet());
  t.teardown(() => sticky.close());
  t.equal((await curl(join(open, 'imds.sock'), '/healthz')).status, 200, 'served from a sticky directory');

  // A directory that cannot be made (its parent is a file): refused with the reason.
  await t.rejects(startImds({ imdsSocket: join(file, 'sub', 'imds.sock'), agentId: 'agent-1' }, quiet()), {
    code: 'DVX_IMDS_SOCKET',
    message: /cannot make the directory/,
  });
});

t.test('connections are bounded: past --max-connections a new one is closed at accept', async (t) => {
  const h = await startHarness(t, { maxConnections: 2 });
  const open = [createConnection({ path: h.socket }), createConnection({ path: h.socket })];
  t.teardown(() => {
    for (const c of open) c.destroy();
  });
  await Promise.all(open.map((c) => new Promise((r) => c.once('connect', r))));
  // The server accepts in order: the two above are counted before this third one.
  const third = await get(h.socket, '/healthz').then(
    (r) => r.status,
    (err: NodeJS.ErrnoException) => err.code ?? 'error',
  );
  t.not(third, 200, 'the third connection is not served');
  for (const c of open) c.destroy();
  t.ok(
    await until(async () => (await get(h.socket, '/healthz')).status === 200, 10_000),
    'served again once the others closed',
  );
});

t.test('an idle client is cut after the headers timeout', async (t) => {
  const h = await startHarness(t, { headersTimeout: 300, requestTimeout: 600 });
  const c = createConnection({ path: h.socket });
  t.teardown(() => c.destroy());
  let text = '';
  c.on('data', (d) => (text += d));
  c.write('GET /v1/config HTTP/1.1\r\nHost: imds\r\n'); // never finishes its headers
  await new Promise((r) => c.once('close', r));
  t.match(text, /^HTTP\/1\.1 408 /, 'answered 408, then closed');
});
