import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Logger } from '../../core/logger.ts';
import { newId } from '../../core/ids.ts';
import { AuditUnavailableError } from '../../audit-wal/errors.ts';
import { gated, type CaptureOptions } from '../../audit-wal/gate.ts';
import type { AuditSink } from '../../audit-wal/sink.ts';
import type { ConfigDocument } from '../../pipeline/policy/config-values.ts';
import { MissingCredentialError } from '../egress/errors.ts';
import type { InjectRule } from '../egress/inject-cred.ts';
import type { SecretSource } from '../llm/secrets-file.ts';
import { agentConfig, agentInDocument, type AgentIdentity } from './agent-config.ts';
import type { CaBundle } from './ca-bundle.ts';
import { credentialOf, ruleViews, rulesBySecret } from './credentials.ts';
import { ANSWERS, notFound, type ImdsAnswer } from './errors.ts';
import type { ImdsMetrics } from './metrics.ts';

// imds's routes (docs/imds.md, "Routes"), all GET, all about the one agent of --agent-id:
//
//   GET /healthz                    {status: "ok"}
//   GET /v1/config                  the agent's merged config and its config_hash (agent-config.ts)
//   GET /v1/ca                      the CA bundle of --imds-ca-cert (application/x-pem-file)
//   GET /v1/credentials             the --inject-cred rules: secret, host, port, header, format (no value)
//   GET /v1/credentials/{secret}    {name, header, value, hosts[, variants]}: the credential, once its
//                                   `credential.read` audit record is durable (capture-or-deny)
//
// Anything else: 404; a method other than GET: 405; a request with a body: 400 (and the connection is
// closed: its body is not read). Errors are `{type: "error", error: {type, message}}`. A secret's value
// appears in the one answer that hands it out, never in a log line, an error or an audit record.

export interface ImdsRouteDeps {
  who: AgentIdentity;
  rules: readonly InjectRule[];
  /** The config values document; null when imds runs without --config-snapshot. */
  config: () => ConfigDocument | null;
  ca: CaBundle | null;
  secrets: SecretSource;
  /** False while the secret broker has not answered once (no credential can be told missing yet). */
  secretsReady: () => boolean;
  audit: AuditSink;
  capture: CaptureOptions;
  log: Logger;
  metrics: ImdsMetrics;
}

type Route = 'healthz' | 'config' | 'ca' | 'credentials' | 'credential' | 'other';

const CREDENTIALS_PREFIX = '/v1/credentials/';
/** How much of a name from the path an error message repeats. */
const MAX_ECHO = 128;

export class ImdsRoutes {
  readonly #d: ImdsRouteDeps;
  readonly #bySecret: Map<string, InjectRule[]>;
  readonly #inFlight = new Set<Promise<void>>();
  #draining = false;

  constructor(deps: ImdsRouteDeps) {
    this.#d = deps;
    this.#bySecret = rulesBySecret(deps.rules);
  }

  readonly handle = (req: IncomingMessage, res: ServerResponse): void => {
    const work = this.#serve(req, res).catch((err: unknown) => {
      this.#d.log.error({ err, method: req.method }, 'imds request failed');
      if (!res.headersSent) this.#send(res, 'other', ANSWERS.internal);
      else res.destroy();
    });
    this.#inFlight.add(work);
    void work.finally(() => this.#inFlight.delete(work));
  };

  /** New requests get 503; resolves once those in flight are answered. */
  async drain(): Promise<void> {
    this.#draining = true;
    while (this.#inFlight.size > 0) await Promise.allSettled([...this.#inFlight]);
  }

  async #serve(req: IncomingMessage, res: ServerResponse): Promise<void> {
    if (this.#draining) return this.#send(res, 'other', ANSWERS.shuttingDown, { connection: 'close' });
    if (req.method !== 'GET') return this.#send(res, 'other', ANSWERS.methodNotAllowed, { allow: 'GET' });
    // A GET carries no body: one that does is refused unread, and its connection with it.
    if (req.headers['transfer-encoding'] !== undefined || Number(req.headers['content-length'] ?? 0) !== 0)
      return this.#send(res, 'other', ANSWERS.bodyRefused, { connection: 'close' });
    const url = req.url ?? '';
    if (!url.startsWith('/')) return this.#send(res, 'other', ANSWERS.badPath);
    const q = url.indexOf('?');
    const path = q < 0 ? url : url.slice(0, q);
    switch (path) {
      case '/healthz':
        return this.#json(res, 'healthz', 200, { status: 'ok' });
      case '/v1/config':
        return this.#config(res);
      case '/v1/ca':
        return this.#ca(res);
      case '/v1/credentials':
        return this.#json(res, 'credentials', 200, { credentials: ruleViews(this.#d.rules) });
    }
    if (path.startsWith(CREDENTIALS_PREFIX)) {
      let name: string;
      try {
        name = decodeURIComponent(path.slice(CREDENTIALS_PREFIX.length));
      } catch {
        return this.#send(res, 'credential', ANSWERS.badEncoding);
      }
      return this.#credential(res, name);
    }
    return this.#send(res, 'other', notFound(`no route GET ${echo(path)}`));
  }

  #config(res: ServerResponse): void {
    const doc = this.#d.config();
    if (doc === null) {
      this.#send(res, 'config', ANSWERS.noConfig);
      return;
    }
    const body = agentConfig(doc, this.#d.who);
    if ('status' in body && 'contentType' in body) this.#send(res, 'config', body);
    else this.#json(res, 'config', 200, body);
  }

  async #ca(res: ServerResponse): Promise<void> {
    if (this.#d.ca === null) return this.#send(res, 'ca', ANSWERS.noCa);
    const pem = await this.#d.ca.read();
    this.#send(res, 'ca', { status: 200, body: pem, contentType: 'application/x-pem-file' });
  }

  /** The agent's org and group as the config snapshot (or --org-id) says; null where nothing says. */
  #place(): { org_id: string; group_id: string | null } {
    const doc = this.#d.config();
    const place = doc ? agentInDocument(doc, this.#d.who) : null;
    if (place && !('status' in place)) return place;
    return { org_id: this.#d.who.orgId, group_id: null };
  }

  async #credential(res: ServerResponse, name: string): Promise<void> {
    const rules = this.#bySecret.get(name);
    if (rules === undefined)
      return this.#send(res, 'credential', notFound(`no --inject-cred rule names secret ${echo(name)}`));
    if (!this.#d.secretsReady()) return this.#send(res, 'credential', ANSWERS.secretsUnavailable);
    const { org_id, group_id } = this.#place();
    const agent = { agentId: this.#d.who.agentId, orgId: org_id };
    let body;
    try {
      body = credentialOf(name, rules, this.#d.secrets, agent);
    } catch (err) {
      if (!(err instanceof MissingCredentialError)) throw err;
      // A refusal is recorded too (docs/decisions.md, "Every refusal is audited"); it stands whatever
      // happens to its record.
      const record = this.#record(name, org_id, group_id, 'deny', err.message);
      this.#d.audit.append('audit_events', record).catch((e: unknown) => {
        this.#d.log.error({ err: e, id: record.id }, 'audit record of a refused credential read lost');
      });
      this.#d.log.info({ secret_name: name, agent_id: agent.agentId }, 'credential refused: its secret is missing');
      return this.#send(res, 'credential', notFound(err.message));
    }
    const record = this.#record(name, org_id, group_id, 'allow', undefined, {
      header: body.header,
      hosts: body.hosts.join(','),
    });
    try {
      // The value leaves only once its record is durable (capture-or-deny): the send is the effect.
      await gated(this.#d.audit, 'audit_events', record, () => this.#json(res, 'credential', 200, body), {
        ...this.#d.capture,
        log: this.#d.log,
      });
    } catch (err) {
      if (!(err instanceof AuditUnavailableError)) throw err;
      return this.#send(res, 'credential', ANSWERS.auditUnavailable);
    }
    this.#d.log.info({ secret_name: name, agent_id: agent.agentId, audit_id: record.id }, 'credential handed out');
  }

  #record(
    secret: string,
    orgId: string,
    groupId: string | null,
    outcome: 'allow' | 'deny',
    reason?: string,
    attrs: Record<string, string> = {},
  ) {
    const doc = this.#d.config();
    const agentId = this.#d.who.agentId;
    return {
      id: newId(),
      event_time: new Date().toISOString(),
      kind: 'event',
      action: 'credential.read',
      actor: `agent:${agentId}`,
      actor_kind: 'agent',
      agent_id: agentId,
      org_id: orgId,
      ...(groupId === null ? {} : { group_id: groupId }),
      enclave_id: doc?.enclave.id ?? '',
      enclave_name: doc?.enclave.name ?? '',
      outcome,
      ...(reason === undefined ? {} : { reason }),
      resource: `secret:${secret}`,
      scope: orgId ? `org:${orgId}` : 'enclave',
      source: 'imds',
      trace_id: newId(),
      attrs: { secret, ...attrs },
    };
  }

  #json(res: ServerResponse, route: Route, status: number, body: unknown): void {
    this.#send(res, route, { status, body: Buffer.from(JSON.stringify(body)), contentType: 'application/json' });
  }

  #send(res: ServerResponse, route: Route, answer: ImdsAnswer, headers: Record<string, string> = {}): void {
    this.#d.metrics.requests.inc({ route, status: answer.status });
    res.writeHead(answer.status, {
      'content-type': answer.contentType,
      'content-length': answer.body.length,
      // A credential or a config must not be kept by anything between (there is nothing, but a client
      // library may cache).
      'cache-control': 'no-store',
      ...headers,
    });
    res.end(answer.body);
  }
}

/** A path or name as an error message repeats it: JSON-quoted (no control character survives), bounded. */
function echo(text: string): string {
  return JSON.stringify(text.length > MAX_ECHO ? `${text.slice(0, MAX_ECHO)}…` : text);
}
