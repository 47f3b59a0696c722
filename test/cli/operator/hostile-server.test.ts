import { spawn } from 'node:child_process';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { mkdtemp, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { DVX_BIN, runDvx } from '../../fixtures/run-dvx.ts';

// The operator CLI against a server that does not play fair: a real HTTP server whose answers are
// scripted per test, and the real bin/dvx. What it must not do: let server-chosen text reach the
// terminal raw, follow the server elsewhere with the token, or say it succeeded when it did not.

type Handler = (req: IncomingMessage, res: ServerResponse) => void;
let handler: Handler = (_req, res) => res.writeHead(500).end();
const seen: { host: string; url: string; authorization?: string }[] = [];
const server = createServer((req, res) => {
  seen.push({ host: String(req.headers.host), url: String(req.url), authorization: req.headers.authorization });
  handler(req, res);
});
await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
const other = createServer((req, res) => {
  seen.push({ host: String(req.headers.host), url: String(req.url), authorization: req.headers.authorization });
  res.writeHead(200, { 'content-type': 'application/json' }).end('{"subject":"elsewhere"}');
});
await new Promise<void>((r) => other.listen(0, '127.0.0.1', r));
const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
const otherUrl = `http://127.0.0.1:${(other.address() as AddressInfo).port}`;
const dir = await mkdtemp(join(tmpdir(), 'dvx-cli-hostile-'));
const tokenFile = join(dir, 'token');
await writeFile(tokenFile, 'the-operators-token');
t.teardown(async () => {
  server.close();
  other.close();
  await rm(dir, { recursive: true, force: true });
});
const env = { XDG_CONFIG_HOME: join(dir, 'xdg') };
const dvx = (args: string[]) => runDvx([...args, '--controlplane', url, '--token-file', tokenFile], { env });
const json =
  (status: number, body: unknown): Handler =>
  (_req, res) =>
    res.writeHead(status, { 'content-type': 'application/json' }).end(JSON.stringify(body));

t.test('table: a column name chosen by the server is escaped like a cell', async (t) => {
  handler = json(200, [{ 'x\u001b]0;pwned\u0007\u202e': 'v' }]);
  const r = await dvx(['whoami', '--output', 'table']);
  t.equal(r.code, 0, r.stderr);
  t.notMatch(r.stdout, /[\u001b\u0007\u202e]/, 'no raw control or bidi character reaches the terminal');
  t.match(r.stdout, /\\u\{1b\}/);
});

t.test('a redirect is not followed: the token stays with the named server, exit non-zero', async (t) => {
  handler = (_req, res) => res.writeHead(307, { location: `${otherUrl}/api/v1/whoami` }).end();
  seen.length = 0;
  const r = await dvx(['whoami']);
  t.not(r.code, 0);
  t.match(r.stderr, /^dvx: 307 /);
  t.same(
    seen.filter((s) => s.host !== new URL(url).host),
    [],
    'nothing reached the other host',
  );
});

t.test('a created key the answer does not hold: no key file claimed, exit non-zero', async (t) => {
  handler = json(201, { id: 'sa-1', owner: 'root' }); // no "credential"
  const keyOut = join(dir, 'sa.key.json');
  const r = await dvx(['service-accounts', 'create', 'robot', '--org', 'org-a', '--key-out', keyOut]);
  t.not(r.code, 0, 'the key did not come back: not a success');
  t.notMatch(r.stderr, /the key is in/);
  t.match(r.stderr, /no key|held no|did not/i);
  await t.rejects(stat(keyOut), { code: 'ENOENT' }, 'no key file holding "undefined" is left behind');
});

t.test('an empty 201 to a key-minting call: a clear error, not a crash', async (t) => {
  handler = (_req, res) => res.writeHead(201).end();
  const keyOut = join(dir, 'broker.key.json');
  const r = await dvx(['enclaves', 'rotate-key', 'enc-1', '--key-out', keyOut]);
  t.not(r.code, 0);
  t.notMatch(r.stderr, /TypeError|at .*\.ts:\d+/, 'no stack trace');
  t.match(r.stderr, /^dvx: /);
  await t.rejects(readFile(keyOut), { code: 'ENOENT' });
});

t.test('plain http to a host that is not loopback is refused before the token goes out', async (t) => {
  for (const flag of ['--controlplane', '--issuer']) {
    const r = await runDvx(
      ['whoami', '--token-file', tokenFile, '--controlplane', url, flag, 'http://10.255.255.1:8443'],
      {
        env,
      },
    );
    t.equal(r.code, 2, `${flag}: a usage error, ${r.stderr}`);
    t.match(r.stderr, /https/, flag);
  }
  // Loopback stays allowed (dvx dev's issuer is http://127.0.0.1).
  handler = json(200, { subject: 'root' });
  const ok = await dvx(['whoami']);
  t.equal(ok.code, 0, ok.stderr);
});

t.test(
  '--idp-key: an issuer whose discovery names a plain-http token endpoint elsewhere gets no assertion',
  async (t) => {
    const { generateKeyPair, exportJWK } = await import('jose');
    const { privateKey } = await generateKeyPair('ES256', { extractable: true });
    const key = join(dir, 'sa-key.json');
    await writeFile(
      key,
      JSON.stringify({
        type: 'service_account_key',
        issuer: url,
        client_id: 'sa',
        key_id: 'k1',
        key: { ...(await exportJWK(privateKey)), alg: 'ES256' },
      }),
    );
    handler = json(200, { issuer: url, token_endpoint: 'http://10.255.255.1/token' });
    const r = await runDvx(['whoami', '--controlplane', url, '--idp-key', key, '--issuer', url], { env });
    t.not(r.code, 0);
    t.match(r.stderr, /token endpoint.*https|https.*token endpoint/i);
    t.notMatch(r.stderr, /cannot reach/, 'refused before any connection was tried');
  },
);

/** bin/dvx on a pseudo-terminal (util-linux `script`), as a person at a terminal runs it: stdout and stderr together. */
function onTerminal(args: string[]): Promise<{ code: number | null; out: string }> {
  const q = (s: string) => `'${s.replace(/'/g, `'\\''`)}'`;
  return new Promise((resolve, reject) => {
    const child = spawn('script', ['-qfec', [DVX_BIN, ...args].map(q).join(' '), '/dev/null'], {
      env: { ...process.env, ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    child.stdout.on('data', (d) => (out += d));
    child.stderr.on('data', (d) => (out += d));
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, out }));
  });
}

t.test('erasure progress on a terminal: the server status is escaped', async (t) => {
  let polls = 0;
  handler = (req, res) => {
    if (req.method === 'POST') return json(202, { org_id: 'org-a', status: 'running' })(req, res);
    polls++;
    json(200, {
      org_id: 'org-a',
      status: polls < 2 ? 'running\u001b]0;pwned\u0007\u001b[2J' : 'complete',
      key_shredded: polls >= 2,
      rows_swept: polls < 2 ? '\u001b[31m' : 3,
    })(req, res);
  };
  const r = await onTerminal([
    'erasure',
    'create',
    'org-a',
    '--interval',
    '0.1',
    '--controlplane',
    url,
    '--token-file',
    tokenFile,
  ]);
  t.equal(r.code, 0, r.out);
  t.notMatch(r.out, /[\u001b\u0007]/, 'no raw escape or bell from the server on the terminal');
  t.match(r.out, /erasing org-a: running\\u\{1b\}/);
});

t.test('a 2xx that is not JSON (a web page, a captive portal) is not reported as success', async (t) => {
  handler = (_req, res) => res.writeHead(200, { 'content-type': 'text/html' }).end('<html>sign in to the wifi</html>');
  const r = await dvx(['orgs', 'create', 'acme', '--name', 'Acme']);
  t.equal(r.code, 3, r.stderr);
  t.match(r.stderr, /not JSON/);
  t.equal(r.stdout, '', 'nothing printed as if it were the answer');
});
