import type { Command } from 'commander';
import { Command as Cmd } from 'commander';
import { addBooleanFlag, flag, parseDurationFlag, parsePositiveInt } from '../core/options.ts';
import { DEFAULT_INSPECT_TIMEOUT_MS } from '../pipeline/engine.ts';
import { ISOLATION_CLASSES, WIRE_FORMATS } from '../pipeline/policy/snapshot.ts';
import {
  INSPECTION_DISCLOSURES,
  LLMPROXY_DEFAULTS,
  validateOptions,
  type LlmProxyOptions,
} from '../proxy/llm/options.ts';
import { OptionsError } from '../proxy/llm/errors.ts';
import { CliError } from './errors.ts';
import { addAuditFlags, addCommonFlags, addConnectionFlags } from './server-flags.ts';
import { addWorkersFlag, serveWithWorkers } from './serve-workers.ts';

// `dvx serve llmproxy`: the inference gateway (spec: Server components, llmproxy row).
export function registerLlmProxy(serve: Command): void {
  const d = LLMPROXY_DEFAULTS;
  const command = addCommonFlags(
    new Cmd('llmproxy').description(
      'inference gateway: agent identity, content pipeline, credential injection, upstream forward, audit',
    ),
    d,
  )
    .addOption(
      flag('--metrics-addr <addr>', {
        description: 'TLS Prometheus listener; empty disables it',
        default: d.metricsAddr,
      }),
    )
    .addOption(
      flag('--enclave-id <id>', {
        description: "enclave id for audit (default: the snapshot's)",
        default: d.enclaveId,
      }),
    )
    .addOption(
      flag('--enclave-name <name>', { description: "enclave name (default: the snapshot's)", default: d.enclaveName }),
    )
    .addOption(
      flag('--agent-ca <file>', {
        description: 'CA bundle for agent identity certificates (mTLS)',
        default: d.agentCa,
      }),
    )
    .addOption(flag('--agent-jwks <file|url>', { description: 'JWKS for platform JWTs (ES256)', default: d.agentJwks }))
    .addOption(
      flag('--gateway-key <file>', {
        description:
          "the network gateway's EC P-256 key (PEM, public or private): its signed identity headers are believed",
        default: d.gatewayKey,
      }),
    )
    .addOption(
      flag('--min-tier <class>', {
        description: 'lowest enclave isolation class served',
        choices: ISOLATION_CLASSES,
        default: d.minTier,
      }),
    )
    .addOption(
      flag('--database-dsn <dsn>', {
        description:
          "read policy, flags and agents from the control plane's PostgreSQL store (instead of --policy-snapshot)",
        default: d.databaseDsn,
      }),
    )
    .addOption(
      flag('--policy-snapshot <file>', {
        description: 'policy snapshot (docs/snapshot.md); re-read on change',
        default: d.policySnapshot,
      }),
    )
    .addOption(
      flag('--secrets-file <file>', {
        description: 'embedded secret source {"agent:ID": {NAME: VALUE}, "org:ID": {…}}',
        default: d.secretsFile,
      }),
    )
    .addOption(
      flag('--secret-broker-url <url>', {
        description:
          "the enclave broker's agent URL: secrets (credentials, secrets-filter needles) come from it (instead of --secrets-file)",
        default: d.secretBrokerUrl,
      }),
    )
    .addOption(
      flag('--secret-broker-token-file <file>', {
        description:
          "the broker's satellite token (its --satellite-token-file), for --secret-broker-url and --approvals-url",
        default: d.secretBrokerTokenFile,
      }),
    )
    .addOption(
      flag('--broker-ca <file>', {
        description: 'CA bundle trusted for the broker (--secret-broker-url, --approvals-url, an https --agent-jwks)',
        default: d.brokerCa,
      }),
    )
    .addOption(
      flag('--approvals-url <url>', {
        description:
          "the enclave broker's agent URL for tool-call approvals (satellite token of --secret-broker-token-file); unset: require_approval is denied",
        default: d.approvalsUrl,
      }),
    )
    .addOption(
      flag('--escalation-timeout <duration>', {
        description: 'how long a tool call is held for a decision before it is denied',
        default: d.escalationTimeout,
        parse: parseDurationFlag,
      }),
    )
    .addOption(
      flag('--inspection-disclosure <mode>', {
        description: 'what an agent reads when its tool call is refused: the reason (detailed) or "refused by policy"',
        choices: INSPECTION_DISCLOSURES,
        default: d.inspectionDisclosure,
      }),
    )
    .addOption(
      flag('--upstream-default <url>', {
        description: 'upstream base URL when policy names none',
        default: d.upstreamDefault,
      }),
    )
    .addOption(
      flag('--upstream-ca <file>', { description: 'extra CA bundle trusted for upstreams', default: d.upstreamCa }),
    )
    .addOption(
      flag('--upstream-timeout <duration>', {
        description: 'how long an upstream may take to answer (its response headers)',
        default: d.upstreamTimeout,
        parse: parseDurationFlag,
      }),
    )
    .addOption(
      flag('--upstream-idle-timeout <duration>', {
        description: 'how long an upstream may send nothing while its answer (a stream) is under way',
        default: d.upstreamIdleTimeout,
        parse: parseDurationFlag,
      }),
    )
    .addOption(
      flag('--inspect-timeout <duration>', {
        description: 'deadline around request-phase inspection',
        default: DEFAULT_INSPECT_TIMEOUT_MS,
        parse: parseDurationFlag,
      }),
    )
    .addOption(
      flag('--max-buffered-bodies <bytes>', {
        description: 'bytes of request bodies held at once, over every call (past it: 503 overloaded_error, retry)',
        default: d.maxBufferedBodies,
        parse: parsePositiveInt,
      }),
    )
    .addOption(
      flag('--max-buffered-bodies-per-agent <bytes>', {
        description:
          'bytes of request bodies one agent may hold at once (past it: 503 overloaded_error, retry); 0 = half of --max-buffered-bodies',
        default: d.maxBufferedBodiesPerAgent,
        parse: parsePositiveInt,
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
    .addOption(
      flag('--translate-upstream-format <format>', {
        description: 'the upstream wire format --translate converts to',
        choices: WIRE_FORMATS,
        default: d.translateUpstreamFormat,
      }),
    )
    .action(async (opts: LlmProxyOptions & { workers: number }) => {
      // One process, or `--workers N` sharing the listener (cli/serve-workers.ts).
      await serveWithWorkers({
        component: 'llmproxy',
        opts,
        validate: validateOptions,
        start: async (o, start) => (await import('../proxy/llm/server.ts')).startLlmProxy(o, start),
        failed: (err) =>
          err instanceof OptionsError
            ? new CliError(err.message)
            : err instanceof CliError
              ? err
              : new CliError(`llmproxy failed to start: ${(err as Error).message}`),
      });
    });
  addBooleanFlag(command, 'inspect-fail-closed', 'refuse with 503 when request inspection fails', d.inspectFailClosed);
  addBooleanFlag(
    command,
    'translate',
    'translate between anthropic-messages, openai-chat and openai-responses',
    d.translate,
  );
  addConnectionFlags(command, d);
  addAuditFlags(command, d, 'an answer');
  addWorkersFlag(command);
  serve.addCommand(command);
}
