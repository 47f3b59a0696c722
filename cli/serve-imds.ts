import type { Command } from 'commander';
import { Command as Cmd } from 'commander';
import { LOG_FORMATS, LOG_LEVELS } from '../core/logger.ts';
import { flag, parseDurationFlag, parsePositiveInt } from '../core/options.ts';
import { runUntilSignal } from '../core/shutdown.ts';
import { ImdsOptionsError, ImdsSocketError } from '../proxy/imds/errors.ts';
import { DEFAULT_IMDS_SOCKET, IMDS_DEFAULTS, parseSocketMode, type ImdsOptions } from '../proxy/imds/options.ts';
import { CliError } from './errors.ts';
import { addAuditFlags } from './server-flags.ts';

// `dvx serve imds`: the agent's metadata service on a unix socket (spec: Server components, imds row;
// docs/imds.md). Of the common flags, --tls-cert/--tls-key are not required (the socket is not TLS;
// they serve --metrics-addr) and --addr is accepted and never opened.

/** `--inject-cred`, repeatable: one rule per flag, kept whole (a rule's `format` may hold commas). */
const collect = (value: string, previous: string[] = []) => [...previous, value];

export function registerImds(serve: Command): void {
  const d = IMDS_DEFAULTS;
  const command = new Cmd('imds')
    .description("agent metadata service on a unix socket: the agent's config, the CA to trust, its credentials")
    .addOption(
      flag('--imds-socket <path>', {
        description: 'the unix socket served (its permissions are the access control)',
        default: DEFAULT_IMDS_SOCKET,
      }),
    )
    .addOption(
      flag('--imds-socket-mode <mode>', {
        description: 'permission bits of the socket, octal (o+w refused)',
        default: d.imdsSocketMode,
        parse: parseSocketMode,
      }),
    )
    .addOption(flag('--agent-id <uid>', { description: 'the agent whose processes mount the socket (required)' }))
    .addOption(
      flag('--org-id <id>', { description: "the agent's org (default: the config snapshot's record of the agent)" }),
    )
    .addOption(
      flag('--config-snapshot <file>', {
        description: 'the config values `dvx config-pull` writes (docs/snapshot.md); re-read on change',
        default: d.configSnapshot,
      }),
    )
    .addOption(
      flag('--imds-ca-cert <file>', {
        description: 'CA bundle (PEM certificates) served at /v1/ca',
        default: d.imdsCaCert,
      }),
    )
    .addOption(
      flag('--inject-cred <rule>', {
        description:
          'credential rule host=GLOB[,port=N],header=NAME,secret=NAME[,format=TEXT {} TEXT] or a JSON object (repeatable)',
        default: [] as string[],
      }).argParser(collect),
    )
    .addOption(
      flag('--secrets-file <file>', {
        description: 'embedded secret source {"agent:ID": {NAME: VALUE}, "org:ID": {…}}',
        default: d.secretsFile,
      }),
    )
    .addOption(
      flag('--secret-broker-url <url>', {
        description: "the enclave broker's agent URL: secrets come from it (instead of --secrets-file)",
        default: d.secretBrokerUrl,
      }),
    )
    .addOption(
      flag('--secret-broker-token-file <file>', {
        description: "the broker's satellite token (its --satellite-token-file)",
        default: d.secretBrokerTokenFile,
      }),
    )
    .addOption(flag('--broker-ca <file>', { description: 'CA bundle trusted for the broker', default: d.brokerCa }))
    .addOption(
      flag('--addr <addr>', { description: 'not opened: imds listens on --imds-socket only (accepted, warned about)' }),
    )
    .addOption(flag('--tls-cert <file>', { description: 'certificate (PEM) of --metrics-addr; the socket is not TLS' }))
    .addOption(flag('--tls-key <file>', { description: 'private key (PEM) of --metrics-addr' }))
    .addOption(
      flag('--metrics-addr <addr>', {
        description: 'TLS Prometheus listener (needs --tls-cert/--tls-key); empty disables it',
        default: d.metricsAddr,
      }),
    )
    .addOption(
      flag('--log-format <format>', { description: 'json or text', choices: LOG_FORMATS, default: d.logFormat }),
    )
    .addOption(
      flag('--log-level <level>', {
        description: 'debug, info, warn or error',
        choices: LOG_LEVELS,
        default: d.logLevel,
      }),
    )
    .addOption(
      flag('--headers-timeout <duration>', {
        description: 'time to receive a complete request header',
        default: d.headersTimeout,
        parse: parseDurationFlag,
      }),
    )
    .addOption(
      flag('--request-timeout <duration>', {
        description: 'time to receive a whole request',
        default: d.requestTimeout,
        parse: parseDurationFlag,
      }),
    )
    .addOption(
      flag('--keep-alive-timeout <duration>', {
        description: 'idle time between two requests on one connection',
        default: d.keepAliveTimeout,
        parse: parseDurationFlag,
      }),
    )
    .addOption(
      flag('--idle-timeout <duration>', {
        description: 'a connection with no traffic and no response in flight is closed after this',
        default: d.idleTimeout,
        parse: parseDurationFlag,
      }),
    )
    .addOption(
      flag('--max-connections <n>', {
        description: 'open connections on the socket; more are closed at accept',
        default: d.maxConnections,
        parse: parsePositiveInt,
      }),
    )
    .action(async (opts: Partial<ImdsOptions>) => {
      let running;
      try {
        running = await (await import('../proxy/imds/server.ts')).startImds(opts);
      } catch (err) {
        if (err instanceof ImdsOptionsError || err instanceof ImdsSocketError) throw new CliError(err.message);
        throw new CliError(`imds failed to start: ${(err as Error).message}`);
      }
      await runUntilSignal(() => running.close());
    });
  addAuditFlags(command, d, 'handing out a credential');
  serve.addCommand(command);
}
