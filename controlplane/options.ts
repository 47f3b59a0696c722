import type { LogFormat, LogLevel } from '../core/logger.ts';
import { ControlPlaneOptionsError } from './errors.ts';
import { AUDIT_DEFAULTS, auditOptionsProblem, type AuditOptions } from '../audit-wal/options.ts';
import { SERVER_LIMIT_DEFAULTS, serverLimitsProblem, type ServerLimitOptions } from '../core/server-limits.ts';

// The control plane's options: one defaults object, one validation (CONTRIBUTING.md, "Layout").

export interface ControlPlaneOptions extends AuditOptions, ServerLimitOptions {
  addr: string;
  tlsCert: string;
  tlsKey: string;
  logFormat: LogFormat;
  logLevel: LogLevel;
  /** Dedicated TLS Prometheus listener; empty disables it. */
  metricsAddr: string;
  /**
   * The enclave this control plane runs beside (spec: Server components, "Common flags"); empty: none.
   * Carried on every log line and in /healthz so a fleet's lines are told apart.
   */
  enclaveId: string;
  enclaveName: string;
  /** OIDC issuer for human and machine principals; empty selects skeleton mode. */
  oidcIssuer: string;
  /** Expected `aud` of operator tokens; empty skips the audience check. */
  oidcAudience: string;
  /** Extra CA bundle trusted when fetching the issuer's discovery document and keys. */
  oidcCa: string;
  /** The claim a token's org is read from. */
  orgClaim: string;
  /** Public base URL of the agent-operator issuer; empty: no agent-operator tokens. */
  agentTokenIssuerUrl: string;
  /** Lifetime of agent-operator tokens in ms; 0 selects 60 s. */
  agentTokenTtl: number;
  /** The token facade's upstream; empty: `<issuer>/oauth/v2/token`. */
  tokenEndpointOverride: string;
  /** postgres://… or pglite://DIR; empty selects skeleton mode. */
  databaseDsn: string;
  /** The control plane's own service-account key at the IdP; provisions service accounts. Empty: not mounted. */
  idpKey: string;
  /** Write the snapshot of --policy-enclave-id into --policy-publish-dir (a co-located enclave). */
  policyPublish: boolean;
  policyPublishDir: string;
  policyOrg: string;
  policyEnclaveId: string;
  /** The same for config values (--config-publish-dir/config.json). */
  configPublish: boolean;
  configPublishDir: string;
  configOrg: string;
  configEnclaveId: string;
  /** KMS wrapping the per-org data keys (crypto-shred): "local" or empty (values stored unsealed). */
  kmsProvider: string;
  /** local: the master key file (created 0600 if absent). */
  kmsConfig: string;
  /** How often the audit tail polls the store (not a flag). */
  auditStreamPollMs: number;
  /** Heartbeat of the broker event stream (spec: 30 s); not a flag, tests shorten it. */
  brokerHeartbeatMs: number;
  /** How often an open stream re-checks its authorization besides after every change (not a flag). */
  streamRecheckMs: number;
  /**
   * How long a pending IdP undo is left to the request that wrote it before the sweep (at start and
   * every half of it) takes it over; longer than any request holds one (not a flag, tests shorten it).
   */
  idpUndoGraceMs: number;
  /** Subjects granted the platform administrator role at start. */
  seedAdmin: string[];
}

export const CONTROLPLANE_DEFAULTS: ControlPlaneOptions = {
  addr: ':8443',
  tlsCert: '',
  tlsKey: '',
  logFormat: 'json',
  logLevel: 'info',
  metricsAddr: '',
  enclaveId: '',
  enclaveName: '',
  oidcIssuer: '',
  oidcAudience: '',
  oidcCa: '',
  orgClaim: 'org_id',
  tokenEndpointOverride: '',
  agentTokenIssuerUrl: '',
  agentTokenTtl: 0,
  databaseDsn: '',
  seedAdmin: [],
  idpKey: '',
  brokerHeartbeatMs: 30_000,
  streamRecheckMs: 5_000,
  idpUndoGraceMs: 600_000,
  auditStreamPollMs: 1000,
  kmsProvider: '',
  kmsConfig: '',
  policyPublish: false,
  policyPublishDir: '',
  policyOrg: '',
  policyEnclaveId: '',
  configPublish: false,
  configPublishDir: '',
  configOrg: '',
  configEnclaveId: '',
  ...AUDIT_DEFAULTS,
  ...SERVER_LIMIT_DEFAULTS,
};

export function validateOptions(input: Partial<ControlPlaneOptions>): ControlPlaneOptions {
  const o = { ...CONTROLPLANE_DEFAULTS, ...input };
  if (!o.tlsCert || !o.tlsKey)
    throw new ControlPlaneOptionsError('--tls-cert and --tls-key are required (the control plane is TLS-only)');
  if (o.oidcIssuer) {
    let url: URL;
    try {
      url = new URL(o.oidcIssuer);
    } catch (err) {
      throw new ControlPlaneOptionsError(`--oidc-issuer "${o.oidcIssuer}" is not an absolute URL`, { cause: err });
    }
    if (url.protocol !== 'https:' && url.hostname !== '127.0.0.1' && url.hostname !== 'localhost') {
      throw new ControlPlaneOptionsError('--oidc-issuer must be https (plain http only on loopback)');
    }
  }
  if (o.agentTokenIssuerUrl && !/^https?:\/\/[^/]+/.test(o.agentTokenIssuerUrl))
    throw new ControlPlaneOptionsError(
      "--agent-token-issuer-url must be an absolute URL (the control plane's public base URL)",
    );
  if (!(o.agentTokenTtl >= 0)) throw new ControlPlaneOptionsError('--agent-token-ttl must not be negative');
  if (o.databaseDsn && !/^(postgres|postgresql|pglite):\/\//.test(o.databaseDsn)) {
    throw new ControlPlaneOptionsError('--database-dsn must be postgres://… or pglite://DIR');
  }
  if (!/^[A-Za-z0-9_.:/-]+$/.test(o.orgClaim)) throw new ControlPlaneOptionsError('--org-claim must be a claim name');
  for (const s of o.seedAdmin) if (!s.trim()) throw new ControlPlaneOptionsError('--seed-admin needs a subject');
  for (const kind of ['policy', 'config'] as const) {
    const on = kind === 'policy' ? o.policyPublish : o.configPublish;
    const dir = kind === 'policy' ? o.policyPublishDir : o.configPublishDir;
    const enclave = kind === 'policy' ? o.policyEnclaveId : o.configEnclaveId;
    if (on && (!dir || !enclave))
      throw new ControlPlaneOptionsError(`--${kind}-publish needs --${kind}-publish-dir and --${kind}-enclave-id`);
  }
  if (o.kmsProvider && o.kmsProvider !== 'local')
    throw new ControlPlaneOptionsError(`--kms-provider ${o.kmsProvider} is not available (local)`);
  if (o.kmsProvider === 'local' && !o.kmsConfig)
    throw new ControlPlaneOptionsError(
      '--kms-provider local needs --kms-config FILE (the master key; created if absent)',
    );
  const audit = auditOptionsProblem(o);
  if (audit) throw new ControlPlaneOptionsError(audit);
  if (!(o.streamRecheckMs > 0)) throw new ControlPlaneOptionsError('streamRecheckMs must be positive');
  if (!(o.idpUndoGraceMs > 0)) throw new ControlPlaneOptionsError('idpUndoGraceMs must be positive');
  const limits = serverLimitsProblem(o);
  if (limits) throw new ControlPlaneOptionsError(limits);
  return o;
}

/** Skeleton mode (spec: Mounting and feature gating): no issuer, or no database. */
export function isSkeleton(o: ControlPlaneOptions): boolean {
  return !o.oidcIssuer || !o.databaseDsn;
}
