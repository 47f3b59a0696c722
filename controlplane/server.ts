import Fastify, { type FastifyInstance, type FastifyRequest } from 'fastify';
import type { AddressInfo } from 'node:net';
import { readFile } from 'node:fs/promises';
import { parseAddr } from '../core/addr.ts';
import { createLogger, type Logger } from '../core/logger.ts';
import { newId } from '../core/ids.ts';
import { loadTls } from '../core/tls.ts';
import { PROBLEM_CONTENT_TYPE } from '../core/problem.ts';
import { ServerLimiter, serverOptions } from '../core/server-limits.ts';
import { startMetricsServer } from '../core/metrics-server.ts';
import { OidcAuthenticator, AuthenticationError, type Principal } from './auth/oidc.ts';
import { callerGrants, grantsChanged } from './authz/capabilities.ts';
import { ApiError, entryForStatus, PROBLEMS, problemOf, sendProblem } from './errors.ts';
import { CONTROLPLANE_DEFAULTS, isSkeleton, OptionsError, validateOptions, type ControlPlaneOptions } from './options.ts';
import { openDb, type Db } from '../core/sql.ts';
import { migrate } from './store/migrate.ts';
import { grantRoutes } from './routes/grants.ts';
import { roleRoutes } from './routes/roles.ts';
import { orgRoutes } from './routes/orgs.ts';
import { memberRoutes } from './routes/members.ts';
import { OPENAPI_ROUTE, openApiDocument, surfaceOperations } from './openapi.ts';
import { VALIDATION } from './schema-errors.ts';
import { STRING, STRINGS, viewSchema } from './routes/schemas.ts';
import { enforceCapability } from './authz/capability-hook.ts';
import type { ChangeDeps } from './audited-change.ts';
import { tokenFacade } from './routes/token-facade.ts';
import { AgentOperatorIssuer } from './auth/agent-operator-issuer.ts';
import { agentOperatorRoutes } from './routes/agent-operator.ts';
import { serviceAccountRoutes } from './routes/service-accounts.ts';
import { policyRoutes } from './routes/policy.ts';
import { featureFlagRoutes } from './routes/feature-flags.ts';
import { effectivePolicyRoutes } from './routes/effective-policy.ts';
import { configValueRoutes } from './routes/config-values.ts';
import { agentRoutes } from './routes/agents.ts';
import { governanceRoutes } from './routes/governance.ts';
import { auditRoutes, type AuditReadOptions } from './routes/audit.ts';
import { openStore, type AuditStore } from '../audit-wal/store.ts';
import { openKms } from './crypto/kms.ts';
import { OrgKeys } from './crypto/org-keys.ts';
import { resumeErasures, type ErasureDeps } from './erasure.ts';
import { erasureRoutes } from './routes/erasure.ts';
import { enclaveRoutes } from './routes/enclaves.ts';
import { brokerRoutes } from './routes/broker.ts';
import { EventHub } from './events.ts';
import { streamGuardDeps } from './stream-guard.ts';
import { startPublisher } from './publish.ts';
import { enclaveConfig, enclaveSnapshot, storeSnapshotDocument } from '../pipeline/policy/store-snapshot.ts';
import { reportSkipped } from './skipped-rows.ts';
import { idpConnectorRoutes } from './routes/idp-connectors.ts';
import { ServiceAccountStatus } from './auth/service-account-status.ts';
import { DcrProvisioner, type IdpProvisioner } from './idp/provisioner.ts';
import { KeyFileError, parseServiceAccountKey } from './idp/service-account-key.ts';
import { fetchTrusting } from '../core/fetch.ts';
import type { AuditSink } from '../audit-wal/sink.ts';
import { StdoutAuditSink } from '../audit-wal/stdout-sink.ts';
import { WalSink } from '../audit-wal/wal-sink.ts';
import { createRegistry } from '../core/metrics.ts';
import type { Registry } from 'prom-client';
import { controlPlaneMetrics } from './metrics.ts';
import { refuseNul } from './nul-guard.ts';
import { startUndoSweeper } from './idp/pending-undo.ts';
import pkg from '../package.json' with { type: 'json' };

// `dvx serve controlplane`: the operator API on fastify over TLS.
//
//   skeleton (no issuer or no database): /healthz + a 501 placeholder everywhere else
//   full: migrations, --seed-admin grants, bearer authentication on /api/v1/*, then the routes
//
// Wiring only: the store and its migrations, the authenticators (OIDC, the agent-operator issuer), the
// audit sink and reader, the KMS and per-org keys, the event hub, then every route family under
// /api/v1 (mountApi; a family whose backing capability is not configured is not mounted), the
// enclave-facing /v1/broker/* routes and the /oauth/token facade.

export interface RunningControlPlane {
  port: number;
  metricsPort: number | null;
  app: FastifyInstance;
  registry: Registry;
  close(): Promise<void>;
}

declare module 'fastify' {
  interface FastifyRequest {
    principal?: Principal;
  }
}

const SKELETON_DETAIL = 'the operator API is not yet implemented here: this control plane runs in skeleton mode (configure --oidc-issuer and --database-dsn)';

export async function startControlPlane(input: Partial<ControlPlaneOptions>, start: { logger?: Logger; audit?: AuditSink; registry?: Registry } = {}): Promise<RunningControlPlane> {
  const options = validateOptions(input);
  const log = start.logger ?? createLogger({ level: options.logLevel, format: options.logFormat, component: 'controlplane' });
  const registry = start.registry ?? createRegistry({ defaultMetrics: Boolean(options.metricsAddr) });
  const metrics = controlPlaneMetrics(registry);
  const tls = await loadTls({ cert: options.tlsCert, key: options.tlsKey });
  const listen = parseAddr(options.addr);
  // Connection bounds (core/server-limits.ts); a request node refuses before fastify sees it
  // (oversized headers, malformed, too slow) is answered as a Problem like every other error.
  const limiter = new ServerLimiter(options, {
    listener: 'controlplane', registry, log,
    answer: (status) => ({ contentType: PROBLEM_CONTENT_TYPE, body: JSON.stringify(problemOf(entryForStatus(status), undefined)) }),
  });
  const app = Fastify({
    https: { cert: tls.cert, key: tls.key, ...serverOptions(options) },
    keepAliveTimeout: options.keepAliveTimeout,
    requestTimeout: options.requestTimeout,
    clientErrorHandler: limiter.clientError,
    // Errors the router raises before any hook (a path segment past maxParamLength, a bad URL encoding).
    frameworkErrors: (err, req, reply) => {
      const status = err.code === 'FST_ERR_MAX_PARAM_LENGTH' ? 414 : err.code === 'FST_ERR_BAD_URL' ? 400 : 500;
      if (status === 500) log.error({ err, url: req.url }, 'controlplane router failed');
      return sendProblem(reply, entryForStatus(status), err.message, req.url.split('?')[0]);
    },
    logger: false, genReqId: () => newId(), bodyLimit: 1024 * 1024, ...VALIDATION,
  });
  limiter.attach(app.server, { clientErrors: false });

  app.setErrorHandler((err: Error & { validation?: unknown; statusCode?: number; code?: string }, req, reply) => {
    if (err instanceof ApiError) return sendProblem(reply, err.entry, err.detail, req.url);
    if (err.validation) return sendProblem(reply, PROBLEMS.badRequest, err.message, req.url);
    if (err.code === 'FST_ERR_CTP_BODY_TOO_LARGE') return sendProblem(reply, PROBLEMS.payloadTooLarge, `request body exceeds ${app.initialConfig.bodyLimit} bytes`, req.url);
    // fastify's own refusals of a request (content type, content length, JSON syntax) keep their status.
    if (err.code?.startsWith('FST_') && err.statusCode && err.statusCode >= 400 && err.statusCode < 500) return sendProblem(reply, entryForStatus(err.statusCode), err.message, req.url);
    if (err.statusCode === 400) return sendProblem(reply, PROBLEMS.badRequest, err.message, req.url);
    log.error({ err, request_id: req.id, url: req.url }, 'controlplane request failed');
    return sendProblem(reply, PROBLEMS.internal, undefined, req.url);
  });

  app.addHook('preValidation', refuseNul);

  app.get('/healthz', async () => ({ component: 'controlplane', status: 'ok', version: pkg.version }));

  let db: Db | null = null;
  let audit: AuditSink | null = null;
  let hub: EventHub | null = null;
  let auditStore: AuditStore | null = null;
  let closeStore = false;
  let erasureDeps: ErasureDeps | null = null;
  const erasureJobs = new Set<Promise<void>>();
  let purge: NodeJS.Timeout | null = null;
  const stopPublishers: (() => void)[] = [];
  let startUndos: (() => { stop(): Promise<void> }) | null = null;
  if (isSkeleton(options)) {
    app.setNotFoundHandler((req, reply) => sendProblem(reply, PROBLEMS.notImplemented, SKELETON_DETAIL, req.url));
    log.warn({ issuer: options.oidcIssuer || null, database: Boolean(options.databaseDsn) }, 'controlplane in skeleton mode');
  } else {
    const issuerCa = options.oidcCa ? await readFile(options.oidcCa) : undefined;
    const idp = options.idpKey ? await openProvisioner(options.idpKey, options.oidcIssuer, issuerCa) : null;
    const kms = options.kmsProvider ? await openKms(options.kmsProvider, options.kmsConfig).catch((err: Error) => {
      throw new OptionsError(err.message);
    }) : null;
    db = await openDb(options.databaseDsn, {
      onPoolError: (err) => {
        metrics.storeConnectionErrors.inc({ connection: 'pool' });
        log.warn({ err }, 'an idle store connection failed; the pool replaces it');
      },
    });
    const applied = await migrate(db);
    if (applied.length > 0) log.info({ migrations: applied }, 'store migrated');
    for (const subject of options.seedAdmin) {
      await db.query(
        `INSERT INTO grants (principal, scope_kind, role, created_by) VALUES ($1, 'platform', 'platform-admin', 'seed-admin') ON CONFLICT DO NOTHING`,
        [`user:${subject}`],
      );
    }
    const oidc = new OidcAuthenticator({ issuer: options.oidcIssuer, audience: options.oidcAudience || undefined, orgClaim: options.orgClaim, ca: issuerCa });
    const accountStatus = new ServiceAccountStatus(db);
    hub = new EventHub();
    await hub.listen(options.databaseDsn, { log, failures: metrics.storeConnectionErrors });
    const events = hub;
    const store = db;
    // A change any replica committed: the grant cache is dropped and open streams re-check at once.
    events.onAuthzChange(() => grantsChanged(store));
    // The hourly purge of consumed events and of deleted enclaves' (spec: Events, fact 3).
    purge = setInterval(() => void events.purge(store).then((n) => n > 0 && log.info({ purged: n }, 'events purged')).catch((err: Error) => log.warn({ err: err.message }, 'event purge failed')), 3_600_000);
    purge.unref();
    const agentIssuer = options.agentTokenIssuerUrl ? await AgentOperatorIssuer.open(store, options.agentTokenIssuerUrl, Math.round(options.agentTokenTtl / 1000)) : null;
    if (agentIssuer) {
      app.get('/.well-known/openid-configuration', async () => agentIssuer.discovery());
      app.get('/.well-known/jwks.json', async () => agentIssuer.jwks());
    }
    // Audit of every change: the WAL shipped to --audit-dsn, or stdout lines with "stream":"audit".
    // With an audit store, the audit read API reads the store the WAL ships to (one instance of it).
    auditStore = options.auditDsn ? await openStore(options.auditDsn) : null;
    if (auditStore) await auditStore.ensureSchema().catch((err: Error) => log.warn({ err: err.message }, 'audit store unreachable at start; reads fail until it answers'));
    audit = start.audit ?? (options.auditDsn
      ? await WalSink.open({ dir: options.auditWalDir, dsn: options.auditDsn, maxBytes: options.auditWalMaxBytes, log, registry, tables: ['audit_events'], store: auditStore! })
      : new StdoutAuditSink());
    closeStore = Boolean(start.audit) && auditStore !== null; // otherwise the WAL sink closes it
    const capture = { captureOrDeny: options.auditCaptureOrDeny, timeoutMs: options.auditCaptureTimeout };
    // Every /api/v1 path, routed or not, authenticates first: an unknown path answers 401 to a caller
    // without a valid token, never 404, so the surface cannot be mapped anonymously.
    app.addHook('onRequest', async (req: FastifyRequest) => {
      if (!req.url.startsWith('/api/v1/') && req.url !== '/api/v1') return;
      const header = req.headers.authorization;
      const token = typeof header === 'string' && /^bearer\s+/i.test(header) ? header.replace(/^bearer\s+/i, '').trim() : '';
      if (!token) throw new ApiError(PROBLEMS.unauthenticated, 'missing bearer token');
      try {
        // The authenticator that accepts a token fixes its kind: a token of our agent-operator issuer is
        // verified by it alone (fail closed, never retried as an OIDC token), any other by the OIDC issuer.
        req.principal = agentIssuer?.claims(token) ? await agentIssuer.authenticate(token) : await oidc.authenticate(token);
        if (req.principal.kind === 'service' && await accountStatus.disabled(req.principal.subject)) throw new AuthenticationError('service account disabled');
      } catch (err) {
        if (err instanceof AuthenticationError) throw new ApiError(PROBLEMS.unauthenticated, err.message);
        throw err;
      }
    });
    const keys = kms ? new OrgKeys(store, kms) : null;
    const deps = { db: store, audit: audit!, capture, keys, log, metrics };
    erasureDeps = { db: store, keys, auditStore, audit: audit!, log };
    // IdP undos a failure or a crash left pending (a client registered for an account never stored, …)
    // run again, at start and then periodically (idp/pending-undo.ts).
    if (idp) startUndos = () => startUndoSweeper(deps, idp, options.idpUndoGraceMs);
    // The OpenAPI document describes the full surface, including route families this process did not
    // wire (spec: Versioning): it is collected from a never-listening instance with every family.
    const guard = streamGuardDeps(registry, log, options.streamRecheckMs, options.idleTimeout);
    const document = openApiDocument(await surfaceOperations((api) => mountApi(api, deps, { agentIssuer: {} as AgentOperatorIssuer, idp: {} as IdpProvisioner, accountStatus, events, auditStore: {} as AuditStore, auditRead: { pollMs: 0, heartbeatMs: 0, guard, accountStatus }, erasure: erasureDeps!, erasureJobs }), VALIDATION));
    await app.register(async (api) => {
      api.addHook('preValidation', enforceCapability(store));
      api.get('/openapi.json', OPENAPI_ROUTE, async () => document);
      await mountApi(api, deps, { agentIssuer, idp, accountStatus, events, auditStore, auditRead: { pollMs: options.auditStreamPollMs, heartbeatMs: 15_000, guard, accountStatus }, erasure: erasureDeps!, erasureJobs, idpUndoGraceMs: options.idpUndoGraceMs });
    }, { prefix: '/api/v1' });
    await app.register(brokerRoutes(deps, events, { heartbeatMs: options.brokerHeartbeatMs, agentIssuer, guard }));
    if (options.policyPublish) {
      stopPublishers.push(await startPublisher({ db: store, hub: events, dir: options.policyPublishDir, file: 'policy-snapshot.json', enclaveId: options.policyEnclaveId, org: options.policyOrg, build: async (db, id, org) => {
        const s = await enclaveSnapshot(db, id, org);
        if (s) reportSkipped(deps, `enclave:${id}`, s.skipped);
        return s && storeSnapshotDocument(s);
      }, log }));
    }
    if (options.configPublish) {
      stopPublishers.push(await startPublisher({ db: store, hub: events, dir: options.configPublishDir, file: 'config.json', enclaveId: options.configEnclaveId, org: options.configOrg, build: (db, id, org) => enclaveConfig(db, id, org, keys ? (o, v) => keys.open(o, v) : undefined), log }));
    }
    await app.register(tokenFacade({ issuer: options.oidcIssuer, override: options.tokenEndpointOverride, ca: issuerCa }));
    app.setNotFoundHandler((req, reply) => sendProblem(reply, PROBLEMS.notFound, `no route ${req.method} ${req.url.split('?')[0]}`, req.url));
  }

  await app.listen({ port: listen.port, host: listen.host ?? '::' });
  const metricsServer = options.metricsAddr
    ? await startMetricsServer({ addr: options.metricsAddr, cert: tls.cert, key: tls.key, registry, limits: options, log }).catch(async (err: Error) => {
      await app.close();
      throw err;
    })
    : null;
  if (erasureDeps) {
    // An erasure a crash interrupted runs again from the top (every step is idempotent).
    const deps = erasureDeps;
    const job = resumeErasures(deps).then(() => {}, (err: Error) => deps.log.error({ err: err.message }, 'resuming erasures failed'));
    erasureJobs.add(job);
    void job.finally(() => erasureJobs.delete(job));
  }
  const undoSweeper = startUndos?.();
  log.info({ addr: app.server.address(), metrics_port: metricsServer?.port ?? null, skeleton: isSkeleton(options) }, 'controlplane listening');
  return {
    port: (app.server.address() as AddressInfo).port,
    metricsPort: metricsServer?.port ?? null,
    app,
    registry,
    close: async () => {
      if (purge) clearInterval(purge);
      await Promise.allSettled([...erasureJobs, undoSweeper?.stop()]);
      for (const stop of stopPublishers) stop();
      await app.close();
      await metricsServer?.close();
      await hub?.close();
      await audit?.close();
      if (closeStore) await auditStore?.close();
      await db?.close();
    },
  };
}

/** The service-account provisioner of --idp-key: the key file read and checked against --oidc-issuer. */
async function openProvisioner(file: string, issuer: string, ca: Buffer | undefined): Promise<IdpProvisioner> {
  let key;
  try {
    key = parseServiceAccountKey(JSON.parse(await readFile(file, 'utf8')));
  } catch (err) {
    throw new OptionsError(`--idp-key ${file}: ${err instanceof KeyFileError || err instanceof SyntaxError ? err.message : (err as Error).message}`);
  }
  if (key.issuer.replace(/\/+$/, '') !== issuer.replace(/\/+$/, '')) throw new OptionsError(`--idp-key ${file} is a key of ${key.issuer}, not of --oidc-issuer ${issuer}`);
  return new DcrProvisioner(issuer, key, fetchTrusting(ca));
}

const WHOAMI_VIEW = viewSchema('whoamiView', { subject: STRING, kind: STRING, org_id: STRING, groups: STRINGS, capabilities: STRINGS });

interface Families {
  agentIssuer: AgentOperatorIssuer | null;
  idp: IdpProvisioner | null;
  accountStatus: ServiceAccountStatus;
  events: EventHub;
  auditStore: AuditStore | null;
  auditRead: AuditReadOptions;
  erasure: ErasureDeps;
  erasureJobs: Set<Promise<void>>;
  /** Grace of a pending IdP undo (options.idpUndoGraceMs); the default where not given. */
  idpUndoGraceMs?: number;
}

/** Every route under /api/v1; a family whose backing capability is not wired is not mounted. */
async function mountApi(api: FastifyInstance, deps: ChangeDeps, wired: Families): Promise<void> {
  // Requires only a valid token (spec: Authentication, rule 1).
  api.get('/whoami', {
    config: { requiredCapability: null }, schema: { response: { 200: WHOAMI_VIEW } },
  }, async (req) => {
    const p = req.principal!;
    const { groups, grants } = await callerGrants(deps.db, p.subject, p.orgId);
    return { subject: p.subject, kind: p.kind, org_id: p.orgId, groups, capabilities: [...new Set(grants.map((g) => g.capability))].sort() };
  });
  await api.register(grantRoutes(deps));
  await api.register(roleRoutes(deps));
  await api.register(orgRoutes(deps));
  await api.register(memberRoutes(deps));
  await api.register(idpConnectorRoutes(deps));
  await api.register(policyRoutes(deps, wired.events));
  await api.register(featureFlagRoutes(deps, wired.events));
  await api.register(effectivePolicyRoutes(deps));
  await api.register(configValueRoutes(deps, wired.events));
  await api.register(agentRoutes(deps, wired.events));
  await api.register(governanceRoutes(deps, wired.events));
  await api.register(enclaveRoutes(deps, wired.events));
  if (wired.agentIssuer) await api.register(agentOperatorRoutes(deps, wired.agentIssuer));
  await api.register(erasureRoutes(deps, wired.erasure, wired.erasureJobs));
  if (wired.auditStore) await api.register(auditRoutes(deps, wired.auditStore, wired.auditRead));
  if (wired.idp) await api.register(serviceAccountRoutes(deps, wired.idp, wired.accountStatus, wired.idpUndoGraceMs ?? CONTROLPLANE_DEFAULTS.idpUndoGraceMs));
}
