import { readFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { Command } from 'commander';
import { LOG_LEVELS, type LogLevel } from '../core/logger.ts';
import { envName, flag } from '../core/options.ts';
import { runUntilSignal } from '../core/shutdown.ts';
import { MOCK_LABEL } from './dev/mock-upstream.ts';
// The system itself (every server) is imported when `dvx dev` runs, not when any dvx command starts.
import type { DevFacts, DevOptions } from './dev/system.ts';
import { CliError, DevStartError } from './errors.ts';
import { EXIT_USAGE } from './exit-codes.ts';
import { checkProfileName } from './operator/profiles.ts';

// `dvx dev` (what `npm start` runs): the whole system on embedded defaults, like `vault server -dev` —
// a local OIDC issuer, the control plane on PGlite, a broker, llmproxy, the gateway, each with its audit
// WAL into PGlite, a demo org, group and agent provisioned through the real lifecycle, example policy,
// and a built-in mock model upstream unless a provider key is in the environment (cli/dev/system.ts,
// docs/dev.md). It prints what to paste; `.dvx/dev.json` holds the same for scripts. SIGINT or SIGTERM
// stops everything. `dvx dev token` prints the demo agent's current token from a running `dvx dev`.

interface DevFlags {
  dir: string;
  controlplaneAddr: string;
  brokerAddr: string;
  brokerOperatorAddr: string;
  llmproxyAddr: string;
  gatewayAddr: string;
  issuerAddr: string;
  upstream: string;
  upstreamAddr: string;
  profileName: string;
  profiles: string;
  logLevel: LogLevel;
}

/** The listeners of `dvx dev`, by flag: a listen error names the flag (and its env) that moves it. */
const LISTENER_FLAGS = [
  ['controlplaneAddr', '--controlplane-addr'],
  ['brokerAddr', '--broker-addr'],
  ['brokerOperatorAddr', '--broker-operator-addr'],
  ['llmproxyAddr', '--llmproxy-addr'],
  ['gatewayAddr', '--gateway-addr'],
  ['issuerAddr', '--issuer-addr'],
  ['upstreamAddr', '--upstream-addr'],
] as const;
type ListenerKey = (typeof LISTENER_FLAGS)[number][0];

/**
 * What a failed start says: the error's message, and for an address in use (or not allowed, or not
 * local) the flag and environment variable of the listener that failed: the one its component was
 * tagged with (DevStartError), or of the broker's two the one whose port it is. An address another
 * flag also names is said to be (dvx dev would conflict with itself).
 */
export function startFailure(err: unknown, flags: Pick<DevFlags, ListenerKey>): string {
  let tagged: readonly string[] = [];
  let listen: (Error & { code?: string; address?: string; port?: number }) | undefined;
  // Along the causes, each once (a cycle of causes ends the walk).
  const seen = new Set<unknown>();
  for (let e: unknown = err; e instanceof Error && !seen.has(e); e = e.cause) {
    seen.add(e);
    if (e instanceof DevStartError && tagged.length === 0) tagged = e.listeners;
    const code = (e as { code?: unknown }).code;
    if (listen === undefined && (code === 'EADDRINUSE' || code === 'EACCES' || code === 'EADDRNOTAVAIL')) listen = e;
  }
  const message = err instanceof Error ? err.message : String(err);
  if (listen?.port === undefined) return message;
  const port = listen.port;
  const at = `${listen.address?.includes(':') ? `[${listen.address}]` : listen.address}:${port}`;
  const candidates = LISTENER_FLAGS.filter(([key]) => tagged.includes(key));
  const key = candidates.length === 1 ? candidates[0][0] : candidates.find(([k]) => portOf(flags[k]) === port)?.[0];
  if (key === undefined) return `cannot listen on ${at}: ${message}`;
  const flag = LISTENER_FLAGS.find(([k]) => k === key)![1];
  const also = LISTENER_FLAGS.filter(([k]) => k !== key && portOf(flags[k]) === port).map(([, f]) => f);
  const why =
    listen.code === 'EADDRINUSE'
      ? also.length > 0
        ? `the address is in use (${also.join(', ')} names the same port)`
        : 'the address is in use (another dvx dev, or another program)'
      : listen.code === 'EACCES'
        ? 'listening there is not permitted'
        : 'the address is not on this machine';
  return `cannot listen on ${at} (${flag}): ${why}; choose another with ${flag} or ${envName(flag.slice(2))}`;
}

/** The port of a `host:port` flag value (`:port`, `[::1]:port`); NaN when it has none. */
function portOf(addr: string): number {
  return Number(addr.slice(addr.lastIndexOf(':') + 1));
}

/**
 * The upstream: `mock` by default when neither ANTHROPIC_API_KEY nor OPENAI_API_KEY is set, the real
 * providers otherwise (the Anthropic key first when both are). `--upstream` decides explicitly.
 */
export function chooseUpstream(
  flagValue: string,
  env: NodeJS.ProcessEnv,
): { upstream: 'mock' | 'providers'; providerKey: string } {
  const key = env.ANTHROPIC_API_KEY || env.OPENAI_API_KEY || '';
  const choice = flagValue || (key ? 'providers' : 'mock');
  if (choice !== 'mock' && choice !== 'providers')
    throw new CliError(`--upstream must be "mock" or "providers", not "${flagValue}"`);
  if (choice === 'providers' && !key)
    throw new CliError('--upstream providers needs ANTHROPIC_API_KEY or OPENAI_API_KEY in the environment');
  return { upstream: choice, providerKey: choice === 'providers' ? key : '' };
}

function banner(f: DevFacts, dir: string, blockedExample: string): string {
  const upstream =
    f.upstream === 'providers'
      ? 'the real providers (the key from your environment)'
      : `${f.upstream}  ${MOCK_LABEL}: a local stand-in, not a model`;
  return [
    '',
    `dvx dev: the whole system is up  (state in ${dir}; facts for scripts in ${join(dir, 'dev.json')})`,
    '',
    `  control plane   ${f.controlplane}`,
    `  broker          ${f.broker}  (operators: ${f.broker_operator})`,
    `  llmproxy        ${f.llmproxy}`,
    `  gateway         ${f.gateway}`,
    `  OIDC issuer     ${f.issuer}`,
    `  model upstream  ${upstream}`,
    `  CA certificate  ${f.ca_cert}`,
    '',
    `The demo agent "${f.agent}" (org "${f.org}") — its token (5 minutes, renewed in dev.json; also: dvx dev token):`,
    '',
    `  export NODE_EXTRA_CA_CERTS=${f.ca_cert}`,
    `  export ANTHROPIC_API_KEY=$(dvx dev token)  ANTHROPIC_BASE_URL=${f.llmproxy}`,
    `  node -e "new (require('@anthropic-ai/sdk').default)().messages.create({model:'claude-sonnet-4-5',max_tokens:64,messages:[{role:'user',content:'hi'}]}).then(m=>console.log(m.content[0].text))"`,
    '',
    `  curl --cacert ${f.ca_cert} ${f.llmproxy}/v1/messages -H "x-api-key: $(dvx dev token)" \\`,
    `    -H 'content-type: application/json' -d '{"model":"claude-sonnet-4-5","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}'`,
    '',
    `  Say "${blockedExample}" in a message: the demo org's content policy blocks it (403).`,
    '',
    `The CLI, logged in as the dev admin (profile "${f.profile}" in ${f.profiles_file}):`,
    '',
    `  dvx whoami --profile ${f.profile}`,
    `  dvx audit tail --profile ${f.profile}`,
    '',
    `Approvals page: ${f.approvals_page}   (Ctrl-C stops everything)`,
    '',
  ].join('\n');
}

export function devCommand(): Command {
  const dev = new Command('dev')
    .description(
      'run the whole system on embedded defaults: OIDC issuer, control plane, broker, llmproxy, gateway, a demo agent',
    )
    .addOption(flag('--dir <dir>', { description: 'where the development state lives', default: '.dvx' }))
    .addOption(
      flag('--controlplane-addr <addr>', { description: "the control plane's listener", default: '127.0.0.1:8443' }),
    )
    .addOption(flag('--broker-addr <addr>', { description: "the broker's agent listener", default: '127.0.0.1:8450' }))
    .addOption(
      flag('--broker-operator-addr <addr>', {
        description: "the broker's operator listener (the approvals page)",
        default: '127.0.0.1:8451',
      }),
    )
    .addOption(flag('--llmproxy-addr <addr>', { description: "llmproxy's listener", default: '127.0.0.1:8480' }))
    .addOption(flag('--gateway-addr <addr>', { description: "the gateway's listener", default: '127.0.0.1:8460' }))
    .addOption(
      flag('--issuer-addr <addr>', {
        description: 'the dev OIDC issuer (plain http, loopback)',
        default: '127.0.0.1:8455',
      }),
    )
    .addOption(
      flag('--upstream <kind>', {
        description:
          'mock (the built-in local model) or providers (the real APIs); default: providers when ANTHROPIC_API_KEY or OPENAI_API_KEY is set, else mock',
        default: '',
      }),
    )
    .addOption(
      flag('--upstream-addr <addr>', { description: "the mock upstream's listener", default: '127.0.0.1:8490' }),
    )
    // Not --profile: its DVX_PROFILE is the operator commands' choice of profile, which must not name the
    // profile dvx dev overwrites. --profiles (DVX_PROFILES) is the same file the operator commands read.
    .addOption(
      flag('--profile-name <name>', { description: 'the CLI profile written for the dev admin', default: 'dev' }),
    )
    .addOption(
      flag('--profiles <file>', {
        description: 'the CLI profiles file (default: $XDG_CONFIG_HOME/dvx/config.json)',
        default: '',
      }),
    )
    .addOption(
      flag('--log-level <level>', {
        description: "the components' log level (their lines go to stderr)",
        default: 'warn',
        choices: LOG_LEVELS,
      }),
    )
    .action(async (opts: DevFlags) => {
      const { profileName, ...rest } = opts;
      checkProfileName(profileName); // before anything starts
      const options: DevOptions = { ...rest, profile: profileName, ...chooseUpstream(opts.upstream, process.env) };
      const { startDevSystem, BLOCKED_EXAMPLE } = await import('./dev/system.ts');
      let system: Awaited<ReturnType<typeof startDevSystem>>;
      try {
        system = await startDevSystem(options);
      } catch (err) {
        // Everything started was stopped again (dev/system.ts); say what failed, and for a listener
        // which flag moves it, rather than a stack trace.
        if (err instanceof CliError) throw err;
        throw new CliError(`dev failed to start: ${startFailure(err, opts)}`, EXIT_USAGE, { cause: err });
      }
      process.stdout.write(banner(system.facts, resolve(opts.dir), BLOCKED_EXAMPLE) + '\n');
      await runUntilSignal(() => system.close());
      process.stderr.write('dvx dev: stopped\n');
    });
  dev
    .command('token')
    .description("print the demo agent's current token (from the dev.json of a running dvx dev)")
    .action(async () => {
      // --dir belongs to `dvx dev` and is read from there.
      const dir = (dev.opts() as { dir: string }).dir;
      const file = join(dir, 'dev.json');
      // A dev.json left by a run that was killed holds a token and ports nobody serves.
      const { runningDevPid } = await import('./dev/system.ts');
      if ((await runningDevPid(dir)) === null)
        throw new CliError(`no dvx dev is running in ${dir} (its dev.json is stale): start "dvx dev" first`);
      let facts: Partial<DevFacts>;
      try {
        facts = JSON.parse(await readFile(file, 'utf8'));
      } catch {
        throw new CliError(`no ${file}: start "dvx dev" first (it writes the token there while it runs)`);
      }
      if (typeof facts.agent_token !== 'string' || !facts.agent_token)
        throw new CliError(`${file} holds no agent_token`);
      process.stdout.write(`${facts.agent_token}\n`);
    });
  return dev;
}
