import t from 'tap';
import { lstat, mkdir, mkdtemp, readdir, readFile, rm, stat, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { AgentHostDirError } from '../../../enclave/errors.ts';
import { agentDir, isSafeUid, placeBootstrapToken, removeBootstrapToken } from '../../../enclave/broker/provision.ts';

// The bootstrap token's place in the agent's host: <dir>/<uid>/bootstrap-token, 0600 in a 0700
// directory, written atomically, never outside <dir> whatever the uid, never through a symlink.

const root = await mkdtemp(join(tmpdir(), 'dvx-provision-'));
t.teardown(() => rm(root, { recursive: true, force: true }));
const dir = join(root, 'agents');

t.test('a uid is one plain path segment', async (t) => {
  for (const uid of ['bot-1', 'a.b', 'A_9', 'x'.repeat(128), 'a:b', 'a@b']) t.ok(isSafeUid(uid), uid);
  for (const uid of [
    '',
    '.',
    '..',
    '.hidden',
    '../evil',
    'a/b',
    'a\\b',
    'a..b',
    'x\u0000y',
    'sp ace',
    'tab\t',
    'nl\n',
    'é',
    'x'.repeat(129),
    '/abs',
  ])
    t.notOk(isSafeUid(uid), JSON.stringify(uid));
  t.throws(() => agentDir(dir, '../evil'), AgentHostDirError);
  t.equal(agentDir(dir, 'bot-1'), join(dir, 'bot-1'));
});

t.test('the token is written 0600 in a 0700 directory, replaced atomically', async (t) => {
  const old = process.umask(0);
  t.teardown(() => void process.umask(old));
  const file = await placeBootstrapToken(dir, 'bot-1', 'dvxb_first');
  t.equal(file, join(dir, 'bot-1', 'bootstrap-token'));
  t.equal(await readFile(file, 'utf8'), 'dvxb_first');
  t.equal((await stat(file)).mode & 0o777, 0o600, 'the file is 0600 even with umask 0');
  t.equal((await stat(join(dir, 'bot-1'))).mode & 0o777, 0o700, 'its directory 0700');
  t.equal((await stat(dir)).mode & 0o777, 0o700, 'the host dir, created, 0700');

  await placeBootstrapToken(dir, 'bot-1', 'dvxb_second');
  t.equal(await readFile(file, 'utf8'), 'dvxb_second', 'replaced');
  t.same(await readdir(join(dir, 'bot-1')), ['bootstrap-token'], 'no temporary file left');

  // A directory that exists with a wider mode is narrowed.
  await mkdir(join(dir, 'bot-2'), { mode: 0o755 });
  await placeBootstrapToken(dir, 'bot-2', 'dvxb_x');
  t.equal((await stat(join(dir, 'bot-2'))).mode & 0o777, 0o700);

  await removeBootstrapToken(dir, 'bot-2');
  t.same(await readdir(join(dir, 'bot-2')), []);
  await removeBootstrapToken(dir, '../evil'); // refused quietly: nothing to remove outside
});

t.test('never outside the host dir: unsafe uids, symlinks, files', async (t) => {
  const outside = join(root, 'outside');
  await mkdir(outside);
  for (const uid of ['../outside', '..', '.', 'a/../../outside', '/tmp']) {
    await t.rejects(placeBootstrapToken(dir, uid, 'dvxb_evil'), AgentHostDirError, JSON.stringify(uid));
  }
  await symlink(outside, join(dir, 'linked'));
  await t.rejects(placeBootstrapToken(dir, 'linked', 'dvxb_evil'), {
    name: 'AgentHostDirError',
    message: /symlink/,
  });
  t.ok((await lstat(join(dir, 'linked'))).isSymbolicLink(), 'the symlink is left as it was');
  await writeFile(join(dir, 'plain'), 'not a dir');
  await t.rejects(placeBootstrapToken(dir, 'plain', 'dvxb_evil'), AgentHostDirError);
  t.same(await readdir(outside), [], 'nothing was written outside');
  t.same(await readdir(root), ['agents', 'outside']);
});
