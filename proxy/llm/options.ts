import {
  ISOLATION_CLASSES,
  WIRE_FORMATS,
  type IsolationClass,
  type WireFormat,
} from '../../pipeline/policy/snapshot.ts';
import {
  DEFAULT_INSPECT_TIMEOUT_MS,
  DEFAULT_INSPECTION_CACHE_MB,
  MAX_INSPECTION_CACHE_MB,
} from '../../pipeline/engine.ts';
import type { LogFormat, LogLevel } from '../../core/logger.ts';
import { AUDIT_DEFAULTS, auditOptionsProblem, type AuditOptions } from '../../audit-wal/options.ts';
import { OptionsError } from './errors.ts';
import { SERVER_LIMIT_DEFAULTS, serverLimitsProblem, type ServerLimitOptions } from '../../core/server-limits.ts';
import { agentShareProblem, defaultAgentShare } from '../../core/body-budget.ts';

// llmproxy's options: one defaults object, one validation (CONTRIBUTING.md, "Layout"). cli/ maps flags and
// DVX_* variables onto it; nothing else reads the environment.

// The official SDKs wait 10 minutes for an answer, and Anthropic's refuses to send a non-streaming call
// it expects to take longer: a plain answer that long is legitimate. An event stream starts at once and
// then sends events (Anthropic pings it); 5 minutes of silence covers a model that thinks at length
// without a word (docs/decisions.md, "A dead upstream is cut, by two timers").
export const DEFAULT_UPSTREAM_TIMEOUT_MS = 600_000;
export const DEFAULT_UPSTREAM_IDLE_TIMEOUT_MS = 300_000;
/** A held tool call with no decision this long is denied (spec: Limits, `--escalation-timeout`). */
export const DEFAULT_ESCALATION_TIMEOUT_MS = 300_000;
/**
 * The longest a call may be held for a person: the official SDKs give up on an answer after 10 minutes,
 * and a longer hold only keeps a connection and an upstream answer pinned for an agent that has left.
 */
export const MAX_ESCALATION_TIMEOUT_MS = 3_600_000;

/** What the agent reads when its tool call is refused (spec: `--inspection-disclosure`). */
export const INSPECTION_DISCLOSURES = ['detailed', 'opaque'] as const;
export type InspectionDisclosure = (typeof INSPECTION_DISCLOSURES)[number];

/**
 * `--max-buffered-bodies`: 64 MiB of request bodies held at once (two of the largest, 32 MB, or a
 * thousand 64 KB ones); past it a call is answered 503 overloaded_error (core/body-budget.ts). A held body
 * costs up to ~3× its size (the budget of DESIGN.md), so this keeps held bodies near 200 MB at most.
 */
export const DEFAULT_MAX_BUFFERED_BODIES = 64 * 1024 * 1024;

export interface LlmProxyOptions extends AuditOptions, ServerLimitOptions {
  addr: string;
  tlsCert: string;
  tlsKey: string;
  logFormat: LogFormat;
  logLevel: LogLevel;
  /** Dedicated TLS Prometheus listener; empty disables it. */
  metricsAddr: string;
  enclaveId: string;
  enclaveName: string;
  /** CA bundle for agent identity certificates (mTLS). */
  agentCa: string;
  /** JWKS (file path or URL) for platform JWTs. */
  agentJwks: string;
  /**
   * The network gateway's key (PEM: its EC P-256 public key, or the private key it signs with): a
   * request with the gateway's identity header is believed when the header verifies with it. Empty: such
   * a request is refused (gateway-identity.ts).
   */
  gatewayKey: string;
  minTier: IsolationClass;
  policySnapshot: string;
  /** The control plane's PostgreSQL store, read directly instead of --policy-snapshot. */
  databaseDsn: string;
  secretsFile: string;
  /** The enclave broker's agent base URL: secrets come from its satellite routes (instead of --secrets-file). */
  secretBrokerUrl: string;
  /** The satellite token the broker issued (its --satellite-token-file). */
  secretBrokerTokenFile: string;
  /** CA bundle trusted for the broker (--secret-broker-url, --approvals-url, and an https --agent-jwks). */
  brokerCa: string;
  /**
   * The broker's agent base URL for tool-call approvals (its satellite approvals routes), authenticated
   * with the satellite token of --secret-broker-token-file. Empty: a `require_approval` call is denied.
   */
  approvalsUrl: string;
  /** ms a tool call is held for a person's decision before it is denied. */
  escalationTimeout: number;
  /** `detailed` names why a tool call was refused to the agent; `opaque` says only "refused by policy". */
  inspectionDisclosure: InspectionDisclosure;
  upstreamDefault: string;
  upstreamCa: string;
  /** ms from the request sent to the upstream's response headers (a plain answer's come with its last token). */
  upstreamTimeout: number;
  /** ms the upstream may send nothing while its answer (an event stream above all) is under way. */
  upstreamIdleTimeout: number;
  inspectTimeout: number;
  inspectFailClosed: boolean;
  /** MiB of per-part inspection results kept (the engine's cacheBytes); 0 turns the cache off. */
  inspectionCacheMb: number;
  /** Bytes of request bodies held at once, over every call (core/body-budget.ts); 503 overloaded_error past it. */
  maxBufferedBodies: number;
  /**
   * Bytes of request bodies one agent may hold at once (core/body-budget.ts), at most maxBufferedBodies;
   * 0 = half of it (one 32 MB body at the default). Resolved by validateOptions.
   */
  maxBufferedBodiesPerAgent: number;
  /** Translate between wire formats when the agent's differs from translateUpstreamFormat. */
  translate: boolean;
  translateUpstreamFormat: WireFormat;
}

export const LLMPROXY_DEFAULTS: LlmProxyOptions = {
  addr: ':8480',
  tlsCert: '',
  tlsKey: '',
  logFormat: 'json',
  logLevel: 'info',
  metricsAddr: '',
  enclaveId: '',
  enclaveName: '',
  agentCa: '',
  agentJwks: '',
  gatewayKey: '',
  minTier: 'plain',
  policySnapshot: '',
  databaseDsn: '',
  secretsFile: '',
  secretBrokerUrl: '',
  secretBrokerTokenFile: '',
  brokerCa: '',
  approvalsUrl: '',
  escalationTimeout: DEFAULT_ESCALATION_TIMEOUT_MS,
  inspectionDisclosure: 'detailed',
  upstreamDefault: '',
  upstreamCa: '',
  upstreamTimeout: DEFAULT_UPSTREAM_TIMEOUT_MS,
  upstreamIdleTimeout: DEFAULT_UPSTREAM_IDLE_TIMEOUT_MS,
  inspectTimeout: DEFAULT_INSPECT_TIMEOUT_MS,
  inspectFailClosed: false,
  inspectionCacheMb: DEFAULT_INSPECTION_CACHE_MB,
  maxBufferedBodies: DEFAULT_MAX_BUFFERED_BODIES,
  maxBufferedBodiesPerAgent: 0,
  translate: false,
  translateUpstreamFormat: 'anthropic-messages',
  ...AUDIT_DEFAULTS,
  ...SERVER_LIMIT_DEFAULTS,
};

export function validateOptions(input: Partial<LlmProxyOptions>): LlmProxyOptions {
  const o = { ...LLMPROXY_DEFAULTS, ...input };
  if (!o.tlsCert || !o.tlsKey) throw new OptionsError('--tls-cert and --tls-key are required (llmproxy is TLS-only)');
  if (!o.agentJwks && !o.agentCa && !o.gatewayKey)
    throw new OptionsError(
      "agents cannot authenticate: set --agent-jwks (platform JWTs), --agent-ca (identity certificates) and/or --gateway-key (the gateway's identity headers)",
    );
  if (!(ISOLATION_CLASSES as readonly string[]).includes(o.minTier))
    throw new OptionsError(`--min-tier must be one of ${ISOLATION_CLASSES.join(', ')}`);
  if (o.upstreamDefault) {
    let url: URL;
    try {
      url = new URL(o.upstreamDefault);
    } catch {
      throw new OptionsError(`--upstream-default "${o.upstreamDefault}" is not an absolute URL`);
    }
    if (url.protocol !== 'http:' && url.protocol !== 'https:')
      throw new OptionsError('--upstream-default must be an http(s) URL');
    o.upstreamDefault = o.upstreamDefault.replace(/\/+$/, '');
  }
  if (o.secretsFile && o.secretBrokerUrl)
    throw new OptionsError('--secrets-file and --secret-broker-url are two sources of the same secrets: choose one');
  if (o.secretBrokerUrl) {
    let url: URL;
    try {
      url = new URL(o.secretBrokerUrl);
    } catch {
      throw new OptionsError(`--secret-broker-url "${o.secretBrokerUrl}" is not an absolute URL`);
    }
    if (url.protocol !== 'https:') throw new OptionsError('--secret-broker-url must be https (the broker is TLS only)');
    if (!o.secretBrokerTokenFile)
      throw new OptionsError("--secret-broker-url needs --secret-broker-token-file (the broker's satellite token)");
    o.secretBrokerUrl = o.secretBrokerUrl.replace(/\/+$/, '');
  }
  if (o.approvalsUrl) {
    let url: URL;
    try {
      url = new URL(o.approvalsUrl);
    } catch {
      throw new OptionsError(`--approvals-url "${o.approvalsUrl}" is not an absolute URL`);
    }
    if (url.protocol !== 'https:') throw new OptionsError('--approvals-url must be https (the broker is TLS only)');
    if (!o.secretBrokerTokenFile)
      throw new OptionsError("--approvals-url needs --secret-broker-token-file (the broker's satellite token)");
    o.approvalsUrl = o.approvalsUrl.replace(/\/+$/, '');
  }
  if (o.secretBrokerTokenFile && !o.secretBrokerUrl && !o.approvalsUrl)
    throw new OptionsError(
      '--secret-broker-token-file is the token of --secret-broker-url and --approvals-url, neither of which is set',
    );
  if (!(o.escalationTimeout >= 1000) || o.escalationTimeout > MAX_ESCALATION_TIMEOUT_MS)
    throw new OptionsError('--escalation-timeout must be from 1s to 1h');
  if (!(INSPECTION_DISCLOSURES as readonly string[]).includes(o.inspectionDisclosure))
    throw new OptionsError(`--inspection-disclosure must be one of ${INSPECTION_DISCLOSURES.join(', ')}`);
  if (!(WIRE_FORMATS as readonly string[]).includes(o.translateUpstreamFormat))
    throw new OptionsError(`--translate-upstream-format must be one of ${WIRE_FORMATS.join(', ')}`);
  if (o.databaseDsn && o.policySnapshot)
    throw new OptionsError('--database-dsn and --policy-snapshot are two sources of the same policy: choose one');
  if (o.databaseDsn && !/^postgres(ql)?:\/\//.test(o.databaseDsn))
    throw new OptionsError(
      "--database-dsn must be postgres://… (the control plane's store; an embedded PGlite store is not shared across processes)",
    );
  const audit = auditOptionsProblem(o);
  if (audit) throw new OptionsError(audit);
  if (!(o.inspectTimeout > 0)) throw new OptionsError('--inspect-timeout must be positive');
  if (
    !Number.isSafeInteger(o.inspectionCacheMb) ||
    o.inspectionCacheMb < 0 ||
    o.inspectionCacheMb > MAX_INSPECTION_CACHE_MB
  )
    throw new OptionsError(`--inspection-cache-mb must be a whole number from 0 (off) to ${MAX_INSPECTION_CACHE_MB}`);
  if (!Number.isSafeInteger(o.maxBufferedBodies) || o.maxBufferedBodies < 1)
    throw new OptionsError('--max-buffered-bodies must be a positive byte count');
  const share = agentShareProblem(o.maxBufferedBodiesPerAgent, o.maxBufferedBodies);
  if (share) throw new OptionsError(share);
  if (o.maxBufferedBodiesPerAgent === 0) o.maxBufferedBodiesPerAgent = defaultAgentShare(o.maxBufferedBodies);
  if (!(o.upstreamTimeout > 0)) throw new OptionsError('--upstream-timeout must be positive');
  if (!(o.upstreamIdleTimeout > 0)) throw new OptionsError('--upstream-idle-timeout must be positive');
  const limits = serverLimitsProblem(o);
  if (limits) throw new OptionsError(limits);
  return o;
}

export function tierRank(tier: IsolationClass): number {
  return ISOLATION_CLASSES.indexOf(tier);
}
