import { access, mkdir, readFile, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { Command } from 'commander';
import { exportJWK, generateKeyPair, importJWK, SignJWT, type JWK } from 'jose';
import { flag } from '../core/options.ts';
import { runUntilSignal } from '../core/shutdown.ts';
import { ensureDevCertificates } from '../core/tls.ts';
import { MAX_TOKEN_LIFETIME_S } from '../proxy/llm/auth.ts';
import { startLlmProxy } from '../proxy/llm/server.ts';
import { CliError } from './errors.ts';

// `dvx dev`: llmproxy on embedded defaults for a first run. Under --dir (default .dvx/) it creates, once:
// a local CA and a localhost server certificate, an ES256 agent-token signing key and its JWKS, an
// example policy snapshot and secrets file. Then it prints a ready agent token with a curl and an SDK
// example, and serves. `dvx dev token` mints more tokens from the same key (development only: in an
// enclave the broker issues them).

const DEV_ORG = 'org-dev';
const DEV_AGENT = 'agent-dev';

interface DevPaths {
  dir: string;
  signingKey: string;
  jwks: string;
  snapshot: string;
  secrets: string;
}

function paths(dir: string): DevPaths {
  const d = resolve(dir);
  return {
    dir: d,
    signingKey: join(d, 'agent-signing-key.json'),
    jwks: join(d, 'agent-jwks.json'),
    snapshot: join(d, 'snapshot.json'),
    secrets: join(d, 'secrets.json'),
  };
}

const exists = (p: string) =>
  access(p).then(
    () => true,
    () => false,
  );

async function writeOnce(path: string, content: () => Promise<string> | string, mode = 0o644): Promise<void> {
  if (!(await exists(path))) await writeFile(path, await content(), { mode });
}

export const EXAMPLE_SNAPSHOT = {
  version: 'dev-1',
  enclave: { id: 'enclave-dev', name: 'dev', isolation_class: 'plain' },
  platform: { credential_mode: { value: 'platform', locked: false } },
  orgs: {
    [DEV_ORG]: {
      config: {
        content_inspection: {
          value: {
            secrets_filter: { enabled: true, severity: 'block' },
            pii_detection: { enabled: true, severity: 'warn' },
            api_key_detection: { enabled: true, severity: 'block' },
            patterns: [{ pattern: '(?i)project[- ]nightingale', description: 'example codename', severity: 'block' }],
          },
        },
      },
      flags: { 'inspect:llm': true, 'audit:llm': true },
      groups: {},
      packs: [],
    },
  },
  agents: {
    [DEV_AGENT]: { org_id: DEV_ORG, group_id: null, name: 'dev-agent', status: 'active', contained: false, config: {} },
  },
};

/** Creates whatever of the development material is missing; never overwrites what is there. */
export async function ensureDevMaterial(
  dir: string,
): Promise<DevPaths & { caCert: string; serverCert: string; serverKey: string }> {
  const p = paths(dir);
  await mkdir(p.dir, { recursive: true, mode: 0o700 });
  const certs = await ensureDevCertificates(p.dir);
  if (!(await exists(p.signingKey))) {
    const { publicKey, privateKey } = await generateKeyPair('ES256', { extractable: true });
    const kid = `dev-${Date.now().toString(36)}`;
    await writeFile(p.signingKey, JSON.stringify({ ...(await exportJWK(privateKey)), kid, alg: 'ES256' }), {
      mode: 0o600,
    });
    await writeFile(
      p.jwks,
      JSON.stringify({ keys: [{ ...(await exportJWK(publicKey)), kid, alg: 'ES256', use: 'sig' }] }),
    );
  }
  await writeOnce(p.snapshot, () => JSON.stringify(EXAMPLE_SNAPSHOT, null, 2) + '\n');
  await writeOnce(
    p.secrets,
    () =>
      JSON.stringify(
        {
          [`agent:${DEV_AGENT}`]: {
            'agent:llmproxy.llm.api_key': 'sk-ant-replace-with-your-key',
            'example-db-password': 'correct-horse-battery-staple',
          },
        },
        null,
        2,
      ) + '\n',
    0o600,
  );
  return { ...p, caCert: certs.caCert, serverCert: certs.serverCert, serverKey: certs.serverKey };
}

export async function mintDevToken(
  dir: string,
  claims: { agent: string; org: string; name?: string; group?: string },
): Promise<string> {
  const p = paths(dir);
  let jwk: JWK & { kid: string };
  try {
    jwk = JSON.parse(await readFile(p.signingKey, 'utf8'));
  } catch {
    throw new CliError(`no signing key in ${p.dir}: run "dvx dev" once to create it`);
  }
  const key = await importJWK(jwk, 'ES256');
  const now = Math.floor(Date.now() / 1000);
  return new SignJWT({
    org_id: claims.org,
    agent_name: claims.name ?? claims.agent,
    ...(claims.group ? { group_id: claims.group } : {}),
  })
    .setProtectedHeader({ alg: 'ES256', kid: jwk.kid, typ: 'JWT' })
    .setSubject(claims.agent)
    .setIssuedAt(now)
    .setExpirationTime(now + MAX_TOKEN_LIFETIME_S)
    .sign(key);
}

function banner(url: string, caCert: string, token: string, dir: string): string {
  return [
    '',
    `dvx dev: llmproxy on ${url}  (material in ${dir})`,
    '',
    `agent token (5 minutes; more with: dvx dev token --agent ${DEV_AGENT} --org ${DEV_ORG}):`,
    token,
    '',
    'try it:',
    `  curl --cacert ${caCert} ${url}/v1/messages -H "x-api-key: $TOKEN" -H 'anthropic-version: 2023-06-01' \\`,
    `    -H 'content-type: application/json' -d '{"model":"claude-sonnet-4-5","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}'`,
    '',
    '  // with the official SDK (NODE_EXTRA_CA_CERTS=' + caCert + ')',
    `  new Anthropic({ apiKey: process.env.TOKEN, baseURL: '${url}' })`,
    '',
    `Put your provider key in ${join(dir, 'secrets.json')} (agent:llmproxy.llm.api_key), or point --upstream-default at a local server.`,
    '',
  ].join('\n');
}

export function devCommand(): Command {
  const dev = new Command('dev')
    .description('run llmproxy on embedded defaults (creates a dev CA, keys, snapshot and secrets on first run)')
    .addOption(flag('--dir <dir>', { description: 'where the development material lives', default: '.dvx' }))
    .addOption(flag('--addr <addr>', { description: 'listen address', default: '127.0.0.1:8480' }))
    .addOption(
      flag('--upstream-default <url>', {
        description: "upstream base URL (default: the providers' APIs)",
        default: '',
      }),
    )
    .action(async (opts: { dir: string; addr: string; upstreamDefault: string }) => {
      const m = await ensureDevMaterial(opts.dir);
      let running;
      try {
        running = await startLlmProxy({
          addr: opts.addr,
          tlsCert: m.serverCert,
          tlsKey: m.serverKey,
          agentJwks: m.jwks,
          policySnapshot: m.snapshot,
          secretsFile: m.secrets,
          upstreamDefault: opts.upstreamDefault,
          logFormat: 'text',
        });
      } catch (err) {
        throw new CliError(`llmproxy failed to start: ${(err as Error).message}`);
      }
      const token = await mintDevToken(opts.dir, { agent: DEV_AGENT, org: DEV_ORG, name: 'dev-agent' });
      process.stderr.write(banner(`https://127.0.0.1:${running.port}`, m.caCert, token, m.dir) + '\n');
      await runUntilSignal(() => running.close());
    });
  dev
    .command('token')
    .description('mint a 5-minute agent token from the dev signing key (development only)')
    .addOption(flag('--agent <id>', { description: 'agent id (sub)', default: DEV_AGENT }))
    .addOption(flag('--org <id>', { description: 'org id', default: DEV_ORG }))
    .addOption(flag('--name <name>', { description: 'agent name' }))
    .addOption(flag('--group <id>', { description: 'group id' }))
    .action(async (opts: { agent: string; org: string; name?: string; group?: string }) => {
      // --dir belongs to `dvx dev` and is read from there.
      process.stdout.write((await mintDevToken((dev.opts() as { dir: string }).dir, opts)) + '\n');
    });
  return dev;
}
