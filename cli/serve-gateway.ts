import type { Command } from 'commander';
import { Command as Cmd, Option } from 'commander';
import { flag, addBooleanFlag, parseBoolean, parseDurationFlag, parsePositiveInt } from '../core/options.ts';
import { GatewayOptionsError, GatewayRuleError } from '../proxy/egress/errors.ts';
import {
  DEFAULT_LLM_HOSTS,
  GATEWAY_DEFAULTS,
  validateGatewayOptions,
  type GatewayOptions,
} from '../proxy/egress/options.ts';
import { OptionsError } from '../proxy/llm/errors.ts';
import { CliError } from './errors.ts';
import { addAuditFlags, addCommonFlags, addConnectionFlags, addMetricsAndEnclaveFlags } from './server-flags.ts';
import { addWorkersFlag, serveWithWorkers } from './serve-workers.ts';

// `dvx serve gateway`: the agents' only way out (docs/gateway.md). Every GatewayOptions field is a flag
// (kebab-case) with its DVX_* variable. Rule flags repeat, one rule per flag: their values hold commas
// (`host=…,header=…,format=Bearer {}`), so they are never split on commas; in the environment, where a
// variable holds one value, rules are separated by newlines. Host lists (--llm-host,
// --no-capture-host) also take commas.

/** A repeatable rule flag: each occurrence adds its rules (one, or several on separate lines). */
function rules(spec: string, description: string): ReturnType<typeof flag> {
  return flag(spec, {
    description: `${description} (repeatable; newline-separated in the environment)`,
    default: [],
  }).argParser((v: string, prev: string[] = []) => [
    ...prev,
    ...v
      .split(/\r?\n/)
      .map((s) => s.trim())
      .filter(Boolean),
  ]);
}

/** A repeatable host-glob flag: each occurrence adds its hosts (comma- or newline-separated). */
function hosts(spec: string, description: string): ReturnType<typeof flag> {
  const option = flag(spec, { description: `${description} (repeatable, or comma-separated)`, default: [] }).argParser(
    (v: string, prev: string[] = []) => [
      ...prev,
      ...v
        .split(/[,\r\n]/)
        .map((s) => s.trim())
        .filter(Boolean),
    ],
  );
  // `--no-capture-host` is a list, not the negation of a `--capture-host`: its value is noCaptureHost.
  option.negate = false;
  return option;
}

export function registerGateway(serve: Command): void {
  const d = GATEWAY_DEFAULTS;
  const command = addMetricsAndEnclaveFlags(
    addCommonFlags(
      new Cmd('gateway').description(
        'the agents’ egress: CONNECT tunnels and plain HTTP, destination policy, interception, credential injection, audit',
      ),
      d,
    ),
    d,
    { id: "enclave id for audit (default: the snapshot's)", name: "enclave name (default: the snapshot's)" },
  )
    .addOption(
      flag('--agent-ca <file>', {
        description: 'CA bundle for agent identity certificates (mTLS)',
        default: d.agentCa,
      }),
    )
    .addOption(flag('--agent-jwks <file|url>', { description: 'JWKS for platform JWTs (ES256)', default: d.agentJwks }))
    .addOption(
      flag('--policy-snapshot <file>', {
        description: 'policy snapshot (docs/snapshot.md): destination policy, packs, agents; re-read on change',
        default: d.policySnapshot,
      }),
    )
    .addOption(
      rules(
        '--allow-dest <rule>',
        'destination allow rule: HOST, HOST:PORT, CIDR, host=…,port=…,cidr=…,reason=… or JSON; together one more gate',
      ),
    )
    .addOption(rules('--deny-dest <rule>', 'destination deny rule, in the spellings of --allow-dest'))
    .addOption(
      flag('--secrets-file <file>', {
        description: 'embedded secret source {"agent:ID": {NAME: VALUE}, "org:ID": {…}}',
        default: d.secretsFile,
      }),
    )
    .addOption(
      flag('--secret-broker-url <url>', {
        description:
          "the enclave broker's agent URL: secrets for --inject-cred, agent-operator tokens for --cp-api-host",
        default: d.secretBrokerUrl,
      }),
    )
    .addOption(
      flag('--secret-broker-token-file <file>', {
        description: "the broker's satellite token (its --satellite-token-file)",
        default: d.secretBrokerTokenFile,
      }),
    )
    .addOption(
      flag('--broker-ca <file>', {
        description: 'CA bundle trusted for the broker (--secret-broker-url, an https --agent-jwks)',
        default: d.brokerCa,
      }),
    )
    .addOption(
      flag('--ca-cert <file>', {
        description: 'interception CA certificate (PEM): leaves are minted from it per SNI',
        default: d.caCert,
      }),
    )
    .addOption(flag('--ca-key <file>', { description: 'interception CA private key (PEM)', default: d.caKey }))
    .addOption(
      flag('--http-capture [bool]', {
        description: 'terminate TLS to captured hosts and record the plaintext; --no-http-capture turns it off',
        default: d.httpCapture,
        parse: parseBoolean,
      }),
    )
    .addOption(new Option('--no-http-capture', 'turn off --http-capture').hideHelp())
    .addOption(
      flag('--http-capture-max-body <bytes>', {
        description: 'plaintext bytes recorded per captured body; 0 = 16 KiB',
        default: d.httpCaptureMaxBody,
        parse: parsePositiveInt,
      }),
    )
    .addOption(
      flag('--max-buffered-bodies <bytes>', {
        description: 'bytes of request bodies held at once for inspection, over every connection (past it: 503, retry)',
        default: d.maxBufferedBodies,
        parse: parsePositiveInt,
      }),
    )
    .addOption(
      flag('--max-buffered-bodies-per-agent <bytes>', {
        description:
          'bytes of request bodies one agent may hold at once for inspection (past it: 503, retry); 0 = half of --max-buffered-bodies',
        default: d.maxBufferedBodiesPerAgent,
        parse: parsePositiveInt,
      }),
    )
    .addOption(
      hosts('--no-capture-host <glob>', 'host never terminated for capture alone (certificate-pinning clients)'),
    )
    .addOption(
      rules(
        '--inject-cred <rule>',
        'credential rule: host=GLOB[,port=N],header=NAME,secret=NAME[,format=… {} …] (format last: it keeps its commas) or JSON',
      ),
    )
    .addOption(
      flag('--llmproxy-addr <url>', {
        description: 'llmproxy (https://host:port): --llm-host requests go there with signed identity headers',
        default: d.llmproxyAddr,
      }),
    )
    .addOption(
      hosts('--llm-host <glob>', `LLM provider host routed to llmproxy (none given: ${DEFAULT_LLM_HOSTS.join(', ')})`),
    )
    .addOption(
      flag('--gateway-key <file>', {
        description: 'ES256 private key (PEM) the identity headers are signed with',
        default: d.gatewayKey,
      }),
    )
    .addOption(
      flag('--cp-api-host <host[:port]>', {
        description: "the control plane's API host: its requests carry an agent-operator token minted by the broker",
        default: d.cpApiHost,
      }),
    )
    .addOption(
      flag('--upstream-ca <file>', {
        description: 'extra CA bundle trusted for TLS the gateway opens (destinations, llmproxy, control plane)',
        default: d.upstreamCa,
      }),
    )
    .addOption(
      flag('--connect-timeout <duration>', {
        description: 'time to resolve a destination and open its TCP connection',
        default: d.connectTimeout,
        parse: parseDurationFlag,
      }),
    )
    .addOption(
      flag('--upstream-timeout <duration>', {
        description: 'time an upstream may take to send its response headers',
        default: d.upstreamTimeout,
        parse: parseDurationFlag,
      }),
    )
    .addOption(
      flag('--tunnel-idle-timeout <duration>', {
        description: 'a tunnel with no byte either way for this long is closed',
        default: d.tunnelIdleTimeout,
        parse: parseDurationFlag,
      }),
    )
    .addOption(
      flag('--inspect-timeout <duration>', {
        description: 'deadline around request-phase inspection',
        default: d.inspectTimeout,
        parse: parseDurationFlag,
      }),
    )
    .addOption(
      flag('--inspection-cache-mb <n>', {
        description:
          'MiB of per-part inspection results kept, so a resent conversation part is not scanned again (0: off)',
        default: d.inspectionCacheMb,
        parse: parsePositiveInt,
      }),
    )
    .action(async (opts: GatewayOptions & { workers: number }) => {
      // One process, or `--workers N` sharing the listener (cli/serve-workers.ts).
      await serveWithWorkers({
        component: 'gateway',
        opts,
        validate: validateGatewayOptions,
        start: async (o, start) => (await import('../proxy/egress/server.ts')).startGateway(o, start),
        failed: (err) =>
          err instanceof GatewayOptionsError || err instanceof GatewayRuleError || err instanceof OptionsError
            ? new CliError(err.message)
            : err instanceof CliError
              ? err
              : new CliError(`gateway failed to start: ${(err as Error).message}`),
      });
    });
  addBooleanFlag(command, 'inspect-fail-closed', 'refuse with 503 when request inspection fails', d.inspectFailClosed);
  addConnectionFlags(command, d);
  addAuditFlags(command, d, 'an injected credential or an agent-operator token');
  addWorkersFlag(command);
  serve.addCommand(command);
}
