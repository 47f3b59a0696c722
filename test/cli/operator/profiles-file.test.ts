import { mkdtemp, readFile, rm, stat, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { readProfiles, writeProfiles } from '../../../cli/operator/profiles.ts';

// The profiles file is replaced whole through a temporary file: a name planted in its folder (a symlink
// where the temporary file goes) must not redirect the write or the chmod to another file.

const dir = await mkdtemp(join(tmpdir(), 'dvx-profiles-file-'));
t.teardown(() => rm(dir, { recursive: true, force: true }));

t.test('a symlink planted at the temporary name is not written through', async (t) => {
  const file = join(dir, 'config.json');
  const victim = join(dir, 'victim.txt');
  await writeFile(victim, 'keep me\n', { mode: 0o644 });
  await symlink(victim, `${file}.${process.pid}.tmp`);
  await writeProfiles(file, { profiles: { dev: { controlplane: 'https://127.0.0.1:8443' } } });
  t.equal(await readFile(victim, 'utf8'), 'keep me\n', 'the symlink target is untouched');
  t.equal((await stat(victim)).mode & 0o777, 0o644, 'and keeps its mode');
  t.same((await readProfiles(file)).profiles.dev, { controlplane: 'https://127.0.0.1:8443' });
  t.equal((await stat(file)).mode & 0o777, 0o600);
});
