import { execFile } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import http from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Test } from 'tap';
import { createLogger } from '../../../core/logger.ts';
import { createRegistry } from '../../../core/metrics.ts';
import type { AuditSink } from '../../../audit-wal/sink.ts';
import { StdoutAuditSink } from '../../../audit-wal/stdout-sink.ts';
import type { ImdsOptions } from '../../../proxy/imds/options.ts';
import { startImds, type ImdsStart, type RunningImds } from '../../../proxy/imds/server.ts';

// What the imds tests share: a temporary directory with a config snapshot and a secrets file, a real
// imds on a unix socket in it (its log lines and stdout audit lines captured), and two real clients of
// the socket: node's http (socketPath) and curl --unix-socket.

export const GH_TOKEN = 'ghp_imds-agent-token-0123456789';
export const ORG_TOKEN = 'org-imds-shared-token-abcdef';
export const OTHER_AGENT_TOKEN = 'ghp_someone-else-9876543210';

export function configDocument(version = 'v1', region = 'eu') {
  return {
    version,
    enclave: { id: 'enc-1', name: 'eu-prod' },
    platform: {
      'log.level': { value: 'info', locked: false, secret: false },
      region: { value: 'platform', locked: false, secret: false },
    },
    orgs: {
      'org-1': {
        config: {
          region: { value: region, locked: true, secret: false },
          'api.token': { value: null, locked: false, secret: true },
          'feature.x': { value: false, locked: false, secret: false },
        },
        groups: { ops: { config: { team: { value: 'ops', locked: false, secret: false } } } },
      },
    },
    agents: {
      'agent-1': {
        org_id: 'org-1',
        group_id: 'ops',
        config: {
          region: { value: 'us', locked: false, secret: false },
          'feature.x': { value: true, locked: false, secret: false },
        },
      },
      'agent-2': { org_id: 'org-1', group_id: null, config: {} },
    },
  };
}

export const SECRETS = {
  'agent:agent-1': { gh_token: GH_TOKEN },
  'agent:agent-2': { gh_token: OTHER_AGENT_TOKEN },
  'org:org-1': { org_token: ORG_TOKEN },
};

export const RULES = [
  'host=api.github.com,header=Authorization,secret=gh_token,format=token {}',
  'host=*.github.com,header=Authorization,secret=gh_token,format=token {}',
  'host=uploads.example.com,port=8443,header=X-Upload-Key,secret=gh_token',
  'host=*.corp.example,header=X-Org-Key,secret=org_token,format=Key {}, v=1',
  'host=db.example.com,header=X-Db,secret=db_password',
];

export interface ImdsHarness {
  dir: string;
  socket: string;
  configFile: string;
  secretsFile: string;
  imds: RunningImds;
  logs: string[];
  audit: Record<string, unknown>[];
  close(): Promise<void>;
}

export async function tempDir(t: Test, prefix = 'dvx-imds-'): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), prefix));
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  return dir;
}

/** A stdout audit sink whose lines land in `into`. */
export function capturingSink(into: Record<string, unknown>[]): AuditSink {
  return new StdoutAuditSink({ write: (s: string) => void into.push(JSON.parse(s)) } as never);
}

export async function startHarness(
  t: Test,
  options: Partial<ImdsOptions> = {},
  start: ImdsStart = {},
): Promise<ImdsHarness> {
  const dir = await tempDir(t);
  const configFile = join(dir, 'config.json');
  const secretsFile = join(dir, 'secrets.json');
  await writeFile(configFile, JSON.stringify(configDocument()));
  await writeFile(secretsFile, JSON.stringify(SECRETS));
  const logs: string[] = [];
  const audit: Record<string, unknown>[] = [];
  const socket = join(dir, 'run', 'imds.sock');
  const imds = await startImds(
    {
      imdsSocket: socket,
      agentId: 'agent-1',
      configSnapshot: configFile,
      secretsFile,
      injectCred: RULES,
      ...options,
    },
    {
      logger: createLogger({ level: 'debug', destination: { write: (s: string) => void logs.push(s) } }),
      registry: createRegistry(),
      audit: capturingSink(audit),
      ...start,
    },
  );
  const h: ImdsHarness = {
    dir,
    socket: imds.socketPath,
    configFile,
    secretsFile,
    imds,
    logs,
    audit,
    close: () => imds.close(),
  };
  t.teardown(() => imds.close());
  return h;
}

export interface Reply {
  status: number;
  headers: http.IncomingHttpHeaders;
  text: string;
  json: any;
}

/** One request over the socket with node's http client (a fresh connection each time). */
export function get(
  socketPath: string,
  path: string,
  init: { method?: string; headers?: Record<string, string>; body?: string } = {},
): Promise<Reply> {
  return new Promise((resolve, reject) => {
    const req = http.request(
      { socketPath, path, method: init.method ?? 'GET', headers: init.headers, agent: false, timeout: 10_000 },
      (res) => {
        let text = '';
        res.setEncoding('utf8');
        res.on('data', (c: string) => (text += c));
        res.on('end', () => {
          let json: unknown = null;
          try {
            json = JSON.parse(text);
          } catch {
            // Not JSON (the CA bundle): the text is the answer.
          }
          resolve({ status: res.statusCode ?? 0, headers: res.headers, text, json });
        });
        res.on('error', reject);
      },
    );
    req.on('timeout', () => req.destroy(new Error('no answer within 10 s')));
    req.on('error', reject);
    req.end(init.body);
  });
}

/** curl --unix-socket SOCK http://imds/PATH: the status and the body. */
export function curl(socketPath: string, path: string, args: string[] = []): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    execFile(
      'curl',
      ['-sS', '--max-time', '10', '--unix-socket', socketPath, '-w', '\n%{http_code}', ...args, `http://imds${path}`],
      (err, stdout, stderr) => {
        if (err) return reject(new Error(`curl failed: ${stderr || err.message}`));
        const cut = stdout.lastIndexOf('\n');
        resolve({ status: Number(stdout.slice(cut + 1)), body: stdout.slice(0, cut) });
      },
    );
  });
}
