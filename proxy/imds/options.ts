import { isAbsolute } from 'node:path';
import type { LogFormat, LogLevel } from '../../core/logger.ts';
import { AUDIT_DEFAULTS, auditOptionsProblem, type AuditOptions } from '../../audit-wal/options.ts';
import { parseInjectRule, type InjectRule } from '../egress/inject-cred.ts';
import { ImdsOptionsError } from './errors.ts';

// imds's options (`dvx serve imds`): one defaults object, one validation. cli/serve-imds.ts maps flags
// and DVX_* variables onto it; nothing else reads the environment. The `--inject-cred` rules are the
// gateway's, parsed by its module (proxy/egress/inject-cred.ts) here, so a rule that does not parse
// refuses the start with the same message the gateway gives.

/** The spec's default socket (spec: Server components, imds row). */
export const DEFAULT_IMDS_SOCKET = '/run/dvx/imds.sock';
/** Owner and group may connect (connecting to a unix socket needs write permission on it). */
export const DEFAULT_IMDS_SOCKET_MODE = 0o660;
/** Linux's sun_path holds 108 bytes, its NUL included. */
const MAX_SOCKET_PATH_BYTES = 107;
/** An agent id as the control plane accepts it (controlplane/routes/agents.ts). */
const AGENT_ID = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;
/** An org id: the snapshot's ids are printable, short, without separators a path or a record splits on. */
const ORG_ID = /^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$/;

export interface ImdsOptions extends AuditOptions {
  /** The unix socket imds serves on; its file permissions are the access control. */
  imdsSocket: string;
  /** The socket's permission bits (chmod after bind). */
  imdsSocketMode: number;
  /** The agent whose processes mount the socket: every answer is about it. */
  agentId: string;
  /** The agent's org; empty: the config snapshot's record of the agent names it. */
  orgId: string;
  /** The config values document `dvx config-pull` writes (docs/snapshot.md, "Config values"); re-read on change. */
  configSnapshot: string;
  /** The CA bundle (PEM) the agent is to trust, served at /v1/ca. */
  imdsCaCert: string;
  /** `--inject-cred` rules as given. */
  injectCred: string[];
  secretsFile: string;
  secretBrokerUrl: string;
  secretBrokerTokenFile: string;
  brokerCa: string;
  logFormat: LogFormat;
  logLevel: LogLevel;
  /** The spec's common `--addr`: accepted, never opened (imds listens on its socket only). */
  addr: string;
  /** The certificate and key of the --metrics-addr listener (the socket itself is not TLS). */
  tlsCert: string;
  tlsKey: string;
  /** Dedicated TLS Prometheus listener; empty disables it. */
  metricsAddr: string;
  /** Time from the connection (or the previous response) to the complete request header. */
  headersTimeout: number;
  /** Time to receive the whole request. */
  requestTimeout: number;
  /** Idle time between two requests on a kept-alive connection. */
  keepAliveTimeout: number;
  /** A connection with no traffic and no response in flight for this long is closed. */
  idleTimeout: number;
  /** Open connections on the socket; past it a new one is closed at accept. */
  maxConnections: number;
}

export const IMDS_DEFAULTS: ImdsOptions = {
  imdsSocket: DEFAULT_IMDS_SOCKET,
  imdsSocketMode: DEFAULT_IMDS_SOCKET_MODE,
  agentId: '',
  orgId: '',
  configSnapshot: '',
  imdsCaCert: '',
  injectCred: [],
  secretsFile: '',
  secretBrokerUrl: '',
  secretBrokerTokenFile: '',
  brokerCa: '',
  logFormat: 'json',
  logLevel: 'info',
  addr: '',
  tlsCert: '',
  tlsKey: '',
  metricsAddr: '',
  // The agent's own processes, on the same host: requests are tiny and answered from memory.
  headersTimeout: 10_000,
  requestTimeout: 30_000,
  keepAliveTimeout: 5_000,
  idleTimeout: 60_000,
  maxConnections: 256,
  ...AUDIT_DEFAULTS,
};

/** `--imds-socket-mode`: octal permission bits, `660` or `0660`. */
export function parseSocketMode(raw: string): number {
  const text = raw.trim();
  if (!/^0?[0-7]{3}$/.test(text))
    throw new ImdsOptionsError(`--imds-socket-mode "${raw}" is not an octal mode such as 0660`);
  return Number.parseInt(text, 8);
}

/** The validated options and the parsed rules (in the order given). */
export interface ValidImdsOptions extends ImdsOptions {
  rules: InjectRule[];
}

export function validateImdsOptions(input: Partial<ImdsOptions>): ValidImdsOptions {
  const o = { ...IMDS_DEFAULTS, ...input };
  if (!o.agentId)
    throw new ImdsOptionsError('--agent-id is required: imds serves one agent, the one that mounts its socket');
  if (!AGENT_ID.test(o.agentId))
    throw new ImdsOptionsError(`--agent-id "${o.agentId}" is not an agent id (1-128 of A-Z a-z 0-9 . _ -)`);
  if (o.orgId && !ORG_ID.test(o.orgId)) throw new ImdsOptionsError(`--org-id "${o.orgId}" is not an org id`);
  if (!o.imdsSocket || !isAbsolute(o.imdsSocket)) throw new ImdsOptionsError('--imds-socket must be an absolute path');
  if (Buffer.byteLength(o.imdsSocket) > MAX_SOCKET_PATH_BYTES)
    throw new ImdsOptionsError(
      `--imds-socket is longer than a unix socket path may be (${MAX_SOCKET_PATH_BYTES} bytes)`,
    );
  if (/[\0\r\n]/.test(o.imdsSocket)) throw new ImdsOptionsError('--imds-socket must not hold a NUL or a line break');
  if (!Number.isInteger(o.imdsSocketMode) || o.imdsSocketMode < 0 || o.imdsSocketMode > 0o777)
    throw new ImdsOptionsError('--imds-socket-mode must be permission bits between 000 and 777');
  // Connecting needs write permission: o+w would hand the agent's credentials to every local user.
  if (o.imdsSocketMode & 0o002)
    throw new ImdsOptionsError(
      "--imds-socket-mode must not let every local user connect (o+w): the socket hands out the agent's credentials",
    );
  if (o.secretsFile && o.secretBrokerUrl)
    throw new ImdsOptionsError(
      '--secrets-file and --secret-broker-url are two sources of the same secrets: choose one',
    );
  if (o.secretBrokerUrl) {
    let url: URL;
    try {
      url = new URL(o.secretBrokerUrl);
    } catch {
      throw new ImdsOptionsError(`--secret-broker-url "${o.secretBrokerUrl}" is not an absolute URL`);
    }
    if (url.protocol !== 'https:') throw new ImdsOptionsError('--secret-broker-url must be https');
    o.secretBrokerUrl = o.secretBrokerUrl.replace(/\/+$/, '');
    if (!o.secretBrokerTokenFile)
      throw new ImdsOptionsError("--secret-broker-url needs --secret-broker-token-file (the broker's satellite token)");
  } else if (o.secretBrokerTokenFile)
    throw new ImdsOptionsError('--secret-broker-token-file is the token of --secret-broker-url, which is not set');
  else if (o.brokerCa) throw new ImdsOptionsError('--broker-ca is the CA of --secret-broker-url, which is not set');
  if (o.injectCred.length > 0 && !o.secretsFile && !o.secretBrokerUrl)
    throw new ImdsOptionsError(
      '--inject-cred needs a secret source: --secret-broker-url (the enclave broker) or --secrets-file',
    );
  const rules: InjectRule[] = [];
  for (const text of o.injectCred) {
    try {
      rules.push(parseInjectRule(text));
    } catch (err) {
      throw new ImdsOptionsError((err as Error).message, { cause: err });
    }
  }
  if (o.metricsAddr && (!o.tlsCert || !o.tlsKey))
    throw new ImdsOptionsError('--metrics-addr needs --tls-cert and --tls-key (the metrics listener is TLS-only)');
  for (const [key, name] of [
    ['headersTimeout', 'headers-timeout'],
    ['requestTimeout', 'request-timeout'],
    ['keepAliveTimeout', 'keep-alive-timeout'],
    ['idleTimeout', 'idle-timeout'],
  ] as const) {
    if (!(o[key] > 0) || !Number.isFinite(o[key])) throw new ImdsOptionsError(`--${name} must be a positive duration`);
  }
  if (o.headersTimeout > o.requestTimeout)
    throw new ImdsOptionsError('--headers-timeout must not exceed --request-timeout');
  if (!Number.isInteger(o.maxConnections) || o.maxConnections < 1)
    throw new ImdsOptionsError('--max-connections must be a positive integer');
  const audit = auditOptionsProblem(o);
  if (audit) throw new ImdsOptionsError(audit);
  return { ...o, rules };
}
