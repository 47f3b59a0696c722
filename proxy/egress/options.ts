import {
  DEFAULT_INSPECT_TIMEOUT_MS,
  DEFAULT_INSPECTION_CACHE_MB,
  MAX_INSPECTION_CACHE_MB,
} from '../../pipeline/engine.ts';
import type { LogFormat, LogLevel } from '../../core/logger.ts';
import { AUDIT_DEFAULTS, auditOptionsProblem, type AuditOptions } from '../../audit-wal/options.ts';
import { SERVER_LIMIT_DEFAULTS, serverLimitsProblem, type ServerLimitOptions } from '../../core/server-limits.ts';
import { agentShareProblem, defaultAgentShare } from '../../core/body-budget.ts';
import { GatewayOptionsError } from './errors.ts';

// The gateway's options (`dvx serve gateway`): one defaults object, one validation. cli/serve-gateway.ts
// maps flags and DVX_* variables onto it; nothing else reads the environment. Rules given as text
// (--allow-dest, --inject-cred, --llm-host) are parsed by their own modules (destination.ts,
// inject-cred.ts) when the gateway starts; a rule that does not parse refuses the start.

/** The gateway's listener: the spec gives it no port; 8460 sits beside the enclave's others (docs/gateway.md). */
export const DEFAULT_GATEWAY_ADDR = ':8460';
/** `--http-capture-max-body 0`: 16 KiB of plaintext per captured body (spec: Limits). */
export const DEFAULT_CAPTURE_MAX_BODY = 16 * 1024;
/** `--max-buffered-bodies`: 1 GiB of request bodies held for inspection at once (32 bodies of 32 MB). */
export const DEFAULT_MAX_BUFFERED_BODIES = 1024 * 1024 * 1024;
/** The provider hosts routed to llmproxy when no --llm-host is given. */
export const DEFAULT_LLM_HOSTS: readonly string[] = ['api.anthropic.com', 'api.openai.com'];

export interface GatewayOptions extends AuditOptions, ServerLimitOptions {
  addr: string;
  tlsCert: string;
  tlsKey: string;
  logFormat: LogFormat;
  logLevel: LogLevel;
  /** Dedicated TLS Prometheus listener; empty disables it. */
  metricsAddr: string;
  enclaveId: string;
  enclaveName: string;
  /** CA bundle for agent identity certificates (mTLS), as llmproxy's --agent-ca. */
  agentCa: string;
  /** JWKS (file path or URL) for platform JWTs, as llmproxy's --agent-jwks. */
  agentJwks: string;
  /** Policy snapshot (docs/snapshot.md): destination_policy, packs, agents' state, content policy. */
  policySnapshot: string;
  /** `--allow-dest` rules as given (destination.ts parses them): together, one more allow gate. */
  allowDest: string[];
  /** `--deny-dest` rules as given: added to the deny rules of the policy. */
  denyDest: string[];
  /** The embedded secret source, as llmproxy's --secrets-file. */
  secretsFile: string;
  /** The broker's agent base URL: secrets (--inject-cred) and agent-operator tokens (--cp-api-host). */
  secretBrokerUrl: string;
  /** The broker's satellite token file (its --satellite-token-file). */
  secretBrokerTokenFile: string;
  /** CA bundle trusted for the broker (and an https --agent-jwks). */
  brokerCa: string;
  /** The interception CA (PEM certificate and key): leaves are minted from it per SNI. */
  caCert: string;
  caKey: string;
  /** Terminate TLS to captured hosts and record the plaintext (on by default). */
  httpCapture: boolean;
  /** Plaintext bytes recorded per captured body; 0 selects DEFAULT_CAPTURE_MAX_BODY. */
  httpCaptureMaxBody: number;
  /** Hosts (globs) never terminated for capture alone (certificate-pinning clients). */
  noCaptureHost: string[];
  /** `--inject-cred` rules as given (inject-cred.ts parses them). */
  injectCred: string[];
  /** llmproxy's base URL (https); requests to --llm-host hosts go there with signed identity headers. */
  llmproxyAddr: string;
  /** Hosts (globs) whose requests go to llmproxy; empty selects DEFAULT_LLM_HOSTS. */
  llmHost: string[];
  /** The ES256 private key (PEM) the gateway signs identity headers with; llmproxy verifies with --gateway-key. */
  gatewayKey: string;
  /** The control plane's API host (`host` or `host:port`): its requests carry an agent-operator token. */
  cpApiHost: string;
  /** Extra CA bundle trusted for what the gateway connects to over TLS (destinations, llmproxy, control plane). */
  upstreamCa: string;
  /** ms to resolve a destination and open its TCP connection. */
  connectTimeout: number;
  /** ms an upstream may take to send its response headers (intercepted and plain HTTP). */
  upstreamTimeout: number;
  /** ms a tunnel may carry no byte either way before it is closed. */
  tunnelIdleTimeout: number;
  inspectTimeout: number;
  inspectFailClosed: boolean;
  /** MiB of per-part inspection results kept (the engine's cacheBytes); 0 turns the cache off. */
  inspectionCacheMb: number;
  /** Bytes of request bodies held at once for inspection, over every connection (core/body-budget.ts). */
  maxBufferedBodies: number;
  /**
   * Bytes of request bodies one agent may hold at once (core/body-budget.ts), at most maxBufferedBodies;
   * 0 = half of it. Resolved by validateGatewayOptions.
   */
  maxBufferedBodiesPerAgent: number;
}

export const GATEWAY_DEFAULTS: GatewayOptions = {
  addr: DEFAULT_GATEWAY_ADDR,
  tlsCert: '',
  tlsKey: '',
  logFormat: 'json',
  logLevel: 'info',
  metricsAddr: '',
  enclaveId: '',
  enclaveName: '',
  agentCa: '',
  agentJwks: '',
  policySnapshot: '',
  allowDest: [],
  denyDest: [],
  secretsFile: '',
  secretBrokerUrl: '',
  secretBrokerTokenFile: '',
  brokerCa: '',
  caCert: '',
  caKey: '',
  httpCapture: true,
  httpCaptureMaxBody: 0,
  noCaptureHost: [],
  injectCred: [],
  llmproxyAddr: '',
  llmHost: [],
  gatewayKey: '',
  cpApiHost: '',
  upstreamCa: '',
  connectTimeout: 10_000,
  upstreamTimeout: 600_000,
  tunnelIdleTimeout: 600_000,
  inspectTimeout: DEFAULT_INSPECT_TIMEOUT_MS,
  inspectFailClosed: false,
  inspectionCacheMb: DEFAULT_INSPECTION_CACHE_MB,
  maxBufferedBodies: DEFAULT_MAX_BUFFERED_BODIES,
  maxBufferedBodiesPerAgent: 0,
  ...AUDIT_DEFAULTS,
  ...SERVER_LIMIT_DEFAULTS,
};

function httpsUrl(flag: string, value: string): string {
  let url: URL;
  try {
    url = new URL(value);
  } catch {
    throw new GatewayOptionsError(`${flag} "${value}" is not an absolute URL`);
  }
  if (url.protocol !== 'https:') throw new GatewayOptionsError(`${flag} must be https`);
  return value.replace(/\/+$/, '');
}

export function validateGatewayOptions(input: Partial<GatewayOptions>): GatewayOptions {
  const o = { ...GATEWAY_DEFAULTS, ...input };
  if (!o.tlsCert || !o.tlsKey)
    throw new GatewayOptionsError('--tls-cert and --tls-key are required (the gateway is TLS-only)');
  if (!o.agentJwks && !o.agentCa)
    throw new GatewayOptionsError(
      'agents cannot authenticate: set --agent-jwks (platform JWTs) and/or --agent-ca (identity certificates)',
    );
  if (Boolean(o.caCert) !== Boolean(o.caKey))
    throw new GatewayOptionsError('--ca-cert and --ca-key go together (the interception CA)');
  if (!Number.isInteger(o.httpCaptureMaxBody) || o.httpCaptureMaxBody < 0)
    throw new GatewayOptionsError('--http-capture-max-body must be 0 (16 KiB) or a positive byte count');
  if (o.httpCaptureMaxBody === 0) o.httpCaptureMaxBody = DEFAULT_CAPTURE_MAX_BODY;
  if (o.llmHost.length === 0) o.llmHost = [...DEFAULT_LLM_HOSTS];
  if (o.llmproxyAddr) {
    // `host:port` is taken as https://host:port (llmproxy is TLS-only).
    if (!/^[a-z][a-z0-9+.-]*:\/\//i.test(o.llmproxyAddr)) o.llmproxyAddr = `https://${o.llmproxyAddr}`;
    o.llmproxyAddr = httpsUrl('--llmproxy-addr', o.llmproxyAddr);
    if (!o.gatewayKey)
      throw new GatewayOptionsError(
        '--llmproxy-addr needs --gateway-key: llmproxy believes only identity headers the gateway signs',
      );
  }
  if (o.secretsFile && o.secretBrokerUrl)
    throw new GatewayOptionsError(
      '--secrets-file and --secret-broker-url are two sources of the same secrets: choose one',
    );
  if (o.secretBrokerUrl) {
    o.secretBrokerUrl = httpsUrl('--secret-broker-url', o.secretBrokerUrl);
    if (!o.secretBrokerTokenFile)
      throw new GatewayOptionsError(
        "--secret-broker-url needs --secret-broker-token-file (the broker's satellite token)",
      );
  } else if (o.secretBrokerTokenFile)
    throw new GatewayOptionsError('--secret-broker-token-file is the token of --secret-broker-url, which is not set');
  if (o.injectCred.length > 0 && !o.secretsFile && !o.secretBrokerUrl)
    throw new GatewayOptionsError(
      '--inject-cred needs a secret source: --secret-broker-url (the enclave broker) or --secrets-file',
    );
  if (o.cpApiHost && !o.secretBrokerUrl)
    throw new GatewayOptionsError(
      '--cp-api-host needs --secret-broker-url: agent-operator tokens are minted by the broker',
    );
  if (o.cpApiHost && !/^[a-z0-9.-]+(:\d{1,5})?$/i.test(o.cpApiHost))
    throw new GatewayOptionsError('--cp-api-host must be a host name, optionally with :port');
  for (const [key, name] of [
    ['connectTimeout', 'connect-timeout'],
    ['upstreamTimeout', 'upstream-timeout'],
    ['tunnelIdleTimeout', 'tunnel-idle-timeout'],
    ['inspectTimeout', 'inspect-timeout'],
  ] as const) {
    if (!(o[key] > 0) || !Number.isFinite(o[key]))
      throw new GatewayOptionsError(`--${name} must be a positive duration`);
  }
  if (
    !Number.isSafeInteger(o.inspectionCacheMb) ||
    o.inspectionCacheMb < 0 ||
    o.inspectionCacheMb > MAX_INSPECTION_CACHE_MB
  )
    throw new GatewayOptionsError(
      `--inspection-cache-mb must be a whole number from 0 (off) to ${MAX_INSPECTION_CACHE_MB}`,
    );
  if (!Number.isSafeInteger(o.maxBufferedBodies) || o.maxBufferedBodies < 1)
    throw new GatewayOptionsError('--max-buffered-bodies must be a positive byte count');
  const share = agentShareProblem(o.maxBufferedBodiesPerAgent, o.maxBufferedBodies);
  if (share) throw new GatewayOptionsError(share);
  if (o.maxBufferedBodiesPerAgent === 0) o.maxBufferedBodiesPerAgent = defaultAgentShare(o.maxBufferedBodies);
  const audit = auditOptionsProblem(o);
  if (audit) throw new GatewayOptionsError(audit);
  const limits = serverLimitsProblem(o);
  if (limits) throw new GatewayOptionsError(limits);
  return o;
}
