import { join } from 'node:path';
import type { LogFormat, LogLevel } from '../../core/logger.ts';
import { AUDIT_DEFAULTS, auditOptionsProblem, type AuditOptions } from '../../audit-wal/options.ts';
import { SERVER_LIMIT_DEFAULTS, serverLimitsProblem, type ServerLimitOptions } from '../../core/server-limits.ts';
import { BrokerOptionsError } from '../errors.ts';

// The broker's options: one defaults object, one validation. cli/serve-broker.ts maps flags and DVX_*
// variables onto it. Everything the broker keeps lives under --state-dir unless a flag moves it.

export interface BrokerOptions extends AuditOptions, ServerLimitOptions {
  /** The agent listener (agent routes, JWKS, satellites). */
  addr: string;
  /** The operator listener (secrets, grants, audit; fronted by the relay). */
  operatorAddr: string;
  tlsCert: string;
  tlsKey: string;
  logFormat: LogFormat;
  logLevel: LogLevel;
  metricsAddr: string;
  enclaveId: string;
  enclaveName: string;
  /** The control plane's base URL; empty runs the enclave on its store alone. */
  controlplane: string;
  /** The broker key's token (the CLI reads it from --broker-key FILE: registerBrokerView.key, or the bare token). */
  brokerKey: string;
  /** CA bundle trusted for the control plane and the local issuer. */
  caCert: string;
  /** OIDC issuer of the operators of this enclave (operator listener). */
  localIssuer: string;
  /** Audience the operator tokens must carry; empty skips the check. */
  localAudience: string;
  /** The claim that names an operator's org. */
  orgClaim: string;
  /** The org that owns this enclave (its operators' org; --seed-admin's grant is over it). */
  owningOrg: string;
  /** Subjects that get the admin grant over the owning org at start. */
  seedAdmin: string[];
  pullInterval: number;
  /** Where the broker keeps its state (database, keys, CA, satellite token) by default. */
  stateDir: string;
  /** Empty: PGlite under --state-dir. */
  databaseDsn: string;
  /** Where bootstrap tokens are written: DIR/<uid>/bootstrap-token. Empty: <state-dir>/agents. */
  agentHostDir: string;
  /** The enclave CA (agent identity certificates); generated on first start when absent. Empty: under --state-dir. */
  enclaveCaCert: string;
  enclaveCaKey: string;
  /** The local KMS master key file (created 0600 if absent). Empty: <state-dir>/kms-key.json. */
  kmsConfig: string;
  /** The satellites' bearer token file (created 0600 if absent). Empty: <state-dir>/satellite-token. */
  satelliteTokenFile: string;
  /** Where the policy snapshot / config are written for co-located satellites (as dvx policy-pull / config-pull). */
  snapshotOut: string;
  configOut: string;
  /** The broker's public agent base URL (the JWT's `iss`, discover's endpoints). Empty: https://<addr>. */
  publicUrl: string;
  /** Signing-key rotation period; retired keys stay published until every token they signed expired. */
  keyRotation: number;
  /** Lifetime of an unused bootstrap token. */
  bootstrapTtl: number;
  /** Lifetime of an unused refresh token (a family lives as long as it is used within it). */
  refreshTtl: number;
  /** SSE heartbeat on the satellite events stream. */
  heartbeatMs: number;
  /** How often an open audit tail (GET /api/v1/audit/stream) asks the audit store for new records. */
  auditStreamPollMs: number;
  /** How often an open stream re-checks its caller's grants with no grant change seen in this process. */
  streamRecheckMs: number;
  /** How often the approvals' sweeper marks pending approvals past their expiry (approvals/sweeper.ts). */
  approvalSweepMs: number;
}

export const BROKER_DEFAULTS: BrokerOptions = {
  addr: ':8450',
  operatorAddr: ':8451',
  tlsCert: '',
  tlsKey: '',
  logFormat: 'json',
  logLevel: 'info',
  metricsAddr: '',
  enclaveId: '',
  enclaveName: '',
  controlplane: '',
  brokerKey: '',
  caCert: '',
  localIssuer: '',
  localAudience: '',
  orgClaim: 'org_id',
  owningOrg: '',
  seedAdmin: [],
  pullInterval: 30_000,
  stateDir: '.dvx/broker',
  databaseDsn: '',
  agentHostDir: '',
  enclaveCaCert: '',
  enclaveCaKey: '',
  kmsConfig: '',
  satelliteTokenFile: '',
  snapshotOut: '',
  configOut: '',
  publicUrl: '',
  keyRotation: 24 * 3600_000,
  bootstrapTtl: 24 * 3600_000,
  refreshTtl: 24 * 3600_000,
  heartbeatMs: 30_000,
  auditStreamPollMs: 1000,
  streamRecheckMs: 5_000,
  approvalSweepMs: 1000,
  ...AUDIT_DEFAULTS,
  ...SERVER_LIMIT_DEFAULTS,
};

/** The options with every default that depends on --state-dir filled in, checked. */
export function validateBrokerOptions(input: Partial<BrokerOptions>): BrokerOptions {
  const o = { ...BROKER_DEFAULTS, ...input };
  if (!o.tlsCert || !o.tlsKey) throw new BrokerOptionsError('--tls-cert and --tls-key are required (TLS only)');
  if (!o.stateDir) throw new BrokerOptionsError('--state-dir must name a directory');
  o.databaseDsn ||= `pglite://${join(o.stateDir, 'db')}`;
  o.agentHostDir ||= join(o.stateDir, 'agents');
  o.enclaveCaCert ||= join(o.stateDir, 'enclave-ca.pem');
  o.enclaveCaKey ||= join(o.stateDir, 'enclave-ca.key');
  o.kmsConfig ||= join(o.stateDir, 'kms-key.json');
  o.satelliteTokenFile ||= join(o.stateDir, 'satellite-token');
  if (!/^(postgres|postgresql|pglite):\/\//.test(o.databaseDsn))
    throw new BrokerOptionsError('--database-dsn must be postgres://… or pglite://DIR');
  if (o.controlplane) {
    if (!/^https?:\/\/[^/]+/.test(o.controlplane))
      throw new BrokerOptionsError('--controlplane must be an absolute http(s) URL');
    if (!o.brokerKey)
      throw new BrokerOptionsError('--controlplane needs --broker-key (the key the enclave was registered with)');
    if (!o.enclaveId) throw new BrokerOptionsError('--controlplane needs --enclave-id (the registered enclave)');
  }
  if (o.localIssuer) {
    let url: URL;
    try {
      url = new URL(o.localIssuer);
    } catch (err) {
      throw new BrokerOptionsError(`--local-issuer "${o.localIssuer}" is not an absolute URL`, { cause: err });
    }
    if (url.protocol !== 'https:' && url.hostname !== '127.0.0.1' && url.hostname !== 'localhost')
      throw new BrokerOptionsError('--local-issuer must be https (plain http only on loopback)');
    if (!o.owningOrg) throw new BrokerOptionsError('--local-issuer needs --owning-org (the org its operators act in)');
  }
  if (o.publicUrl && !/^https:\/\/[^/]+/.test(o.publicUrl))
    throw new BrokerOptionsError('--public-url must be an https URL');
  if (!/^[A-Za-z0-9_.:/-]+$/.test(o.orgClaim)) throw new BrokerOptionsError('--org-claim must be a claim name');
  for (const s of o.seedAdmin) if (!s.trim()) throw new BrokerOptionsError('--seed-admin needs a subject');
  if (o.seedAdmin.length > 0 && !o.owningOrg)
    throw new BrokerOptionsError('--seed-admin needs --owning-org (the admin grant is over that org)');
  for (const [name, v] of [
    ['--pull-interval', o.pullInterval],
    ['--key-rotation', o.keyRotation],
    ['--bootstrap-ttl', o.bootstrapTtl],
    ['--refresh-ttl', o.refreshTtl],
    ['heartbeat', o.heartbeatMs],
    ['auditStreamPollMs', o.auditStreamPollMs],
    ['streamRecheckMs', o.streamRecheckMs],
    ['approvalSweepMs', o.approvalSweepMs],
  ] as const)
    if (!(v > 0)) throw new BrokerOptionsError(`${name} must be positive`);
  if (o.keyRotation < 15 * 60_000)
    throw new BrokerOptionsError('--key-rotation must be at least 15m (a key outlives the tokens it signed)');
  const audit = auditOptionsProblem(o);
  if (audit) throw new BrokerOptionsError(audit);
  const limits = serverLimitsProblem(o);
  if (limits) throw new BrokerOptionsError(limits);
  return o;
}
