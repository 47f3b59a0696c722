import { spawn } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { runDvx } from '../../fixtures/run-dvx.ts';

// dvx completion bash|zsh: the scripts parse (bash -n, zsh -n), and the bash one completes commands,
// subcommands and options when its function is called the way bash calls it (COMP_WORDS, COMP_CWORD).

const dir = await mkdtemp(join(tmpdir(), 'dvx-completion-'));
t.teardown(() => rm(dir, { recursive: true, force: true }));

function sh(shell: string, args: string[]): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(shell, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d) => (stdout += d));
    child.stderr.on('data', (d) => (stderr += d));
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, stdout, stderr }));
  });
}

const shellExists = async (shell: string) => (await sh('sh', ['-c', `command -v ${shell}`])).code === 0;

const bash = await runDvx(['completion', 'bash']);
const bashFile = join(dir, 'dvx.bash');
await writeFile(bashFile, bash.stdout);

t.test('bash: the script parses', async (t) => {
  t.equal(bash.code, 0, bash.stderr);
  const r = await sh('bash', ['-n', bashFile]);
  t.equal(r.code, 0, r.stderr);
});

/** What the completion function offers for the words typed (the last one is being completed). */
async function complete(words: string[]): Promise<string[]> {
  const quoted = words.map((w) => `'${w}'`).join(' ');
  const r = await sh('bash', [
    '-c',
    `source '${bashFile}'; COMP_WORDS=(${quoted}); COMP_CWORD=${words.length - 1}; _dvx_complete; printf '%s\\n' "\${COMPREPLY[@]}"`,
  ]);
  if (r.code !== 0) throw new Error(r.stderr);
  return r.stdout.split('\n').filter(Boolean).sort();
}

t.test('bash: commands, subcommands and options complete', async (t) => {
  t.same(await complete(['dvx', 'or']), ['orgs']);
  t.same(await complete(['dvx', 'se']), ['secret', 'serve', 'service-accounts'].sort());
  t.same(await complete(['dvx', 'orgs', '']), ['create', 'delete', 'get', 'list', 'set']);
  t.same(await complete(['dvx', 'service-accounts', 'keys', '']), ['create', 'delete']);
  t.same(await complete(['dvx', 'grant', 'create', '--org', 'acme', '--ro']), ['--role']);
  t.ok(await complete(['dvx', 'agent', 'list', '--']).then((o) => o.includes('--controlplane')), 'client options');
  t.same(await complete(['dvx', 'whoami', '--pro']), ['--profile', '--profiles']);
  // A value of an option that takes one is not a command word: `--org orgs` does not enter `orgs`.
  t.same(await complete(['dvx', 'groups', 'list', '--org', 'orgs', '--or']), ['--org']);
});

// zsh is installed by .ci/run (Debian's zsh); without it this fails rather than passing unseen.
t.test('zsh: the script parses and loads', async (t) => {
  t.ok(await shellExists('zsh'), 'zsh is installed (apt-get install zsh)');
  const zsh = await runDvx(['completion', 'zsh']);
  t.equal(zsh.code, 0, zsh.stderr);
  const file = join(dir, '_dvx');
  await writeFile(file, zsh.stdout);
  const r = await sh('zsh', ['-n', file]);
  t.equal(r.code, 0, r.stderr);
  // Sourced for real with compinit: the tables load and the function is registered for dvx.
  const loaded = await sh('zsh', [
    '-f',
    '-c',
    `autoload -U compinit && compinit -u -D; source '${file}'; print -r -- "\${_dvx_subs[dvx orgs]}"; print -r -- "\${_comps[dvx]}"`,
  ]);
  t.equal(loaded.code, 0, loaded.stderr);
  t.equal(loaded.stdout, 'list get create set delete\n_dvx\n');
});

t.test('an unknown shell is a usage error', async (t) => {
  const r = await runDvx(['completion', 'fish']);
  t.equal(r.code, 2);
  t.match(r.stderr, /bash, zsh|Allowed choices/);
});
