import { spawnSync } from 'node:child_process';
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { runDvx } from '../fixtures/run-dvx.ts';

// One `dvx dev` per directory, and what is left when one did not stop cleanly (SIGKILL, a crash): its
// dev.json names ports and a token nobody serves any more, so `dvx dev token` must not hand it out.

const work = await mkdtemp(join(tmpdir(), 'dvx-dev-lock-'));
t.teardown(() => rm(work, { recursive: true, force: true }));
const facts = { agent_token: 'eyJ.stale.token', controlplane: 'https://127.0.0.1:1' };

/** The pid of a process that has exited. */
function deadPid(): number {
  const r = spawnSync(process.execPath, ['-e', 'process.stdout.write(String(process.pid))']);
  return Number(r.stdout.toString());
}

t.test('dvx dev token refuses the dev.json of a dvx dev that is gone', async (t) => {
  for (const [name, lock] of [
    ['a lock whose process is gone', `${deadPid()}\n`],
    ['no lock at all', undefined],
  ] as const) {
    const dir = join(work, name.replace(/\W+/g, '-'));
    await mkdir(dir);
    await writeFile(join(dir, 'dev.json'), JSON.stringify(facts));
    if (lock) await writeFile(join(dir, 'dev.lock'), lock);
    const r = await runDvx(['dev', '--dir', dir, 'token']);
    t.not(r.code, 0, name);
    t.notMatch(r.stdout, /stale/, `${name}: the dead run's token is not printed`);
    t.match(r.stderr, /no dvx dev is running/, name);
  }
});

t.test('dvx dev token answers while the dvx dev that wrote dev.json runs', async (t) => {
  const dir = join(work, 'live');
  await mkdir(dir);
  await writeFile(join(dir, 'dev.json'), JSON.stringify(facts));
  await writeFile(join(dir, 'dev.lock'), `${process.pid}\n`); // this test stands in for the running dvx dev
  const r = await runDvx(['dev', '--dir', dir, 'token']);
  t.equal(r.code, 0, r.stderr);
  t.equal(r.stdout, `${facts.agent_token}\n`);
});

t.test('a dvx dev holding the directory keeps it: a second start is refused and touches nothing', async (t) => {
  const dir = join(work, 'held');
  await mkdir(dir);
  await writeFile(join(dir, 'dev.json'), JSON.stringify(facts));
  await writeFile(join(dir, 'dev.lock'), `${process.pid}\n`);
  const r = await runDvx(['dev', '--dir', dir, '--issuer-addr', '127.0.0.1:0', '--controlplane-addr', '127.0.0.1:0']);
  t.equal(r.code, 2, r.stderr);
  t.match(r.stderr, new RegExp(`in use by a running dvx dev \\(pid ${process.pid}\\)`));
  t.same(JSON.parse(await readFile(join(dir, 'dev.json'), 'utf8')), facts, 'dev.json untouched');
});
