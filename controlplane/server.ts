import Fastify, { type FastifyInstance } from 'fastify';
import type { AddressInfo } from 'node:net';
import { readFile } from 'node:fs/promises';
import { parseAddr } from '../core/addr.ts';
import { createLogger, type Logger } from '../core/logger.ts';
import { newId } from '../core/ids.ts';
import { loadTls } from '../core/tls.ts';
import { PROBLEM_CONTENT_TYPE } from '../core/problem.ts';
import { ServerLimiter, serverOptions } from '../core/server-limits.ts';
import { startMetricsServer } from '../core/metrics-server.ts';
import { OidcAuthenticator } from '../core/oidc.ts';
import { grantsChanged } from './authz/capabilities.ts';
import { ControlPlaneOptionsError, entryForStatus, PROBLEMS, problemOf, sendProblem } from './errors.ts';
import { isSkeleton, validateOptions, type ControlPlaneOptions } from './options.ts';
import { openDb, type Db } from '../core/sql.ts';
import { migrate } from './store/migrate.ts';
import { seedPlatformAdmin } from './store/grants.ts';
import { openApiDocument, surfaceOperations } from './openapi.ts';
import { VALIDATION } from '../core/schema-errors.ts';
import { tokenFacade } from './routes/token-facade.ts';
import { AgentOperatorIssuer } from './auth/agent-operator-issuer.ts';
import type { AuditStore } from '../audit-wal/store.ts';
import { openKms } from '../core/kms.ts';
import { OrgKeys } from './crypto/org-keys.ts';
import { resumeErasures, type ErasureDeps } from './erasure.ts';
import { brokerRoutes } from './routes/broker.ts';
import { problems } from '../core/problems-plugin.ts';
import { health } from './plugins/health.ts';
import { bearerAuth } from './plugins/bearer-auth.ts';
import { agentIssuerDiscovery } from './plugins/agent-issuer-discovery.ts';
import { apiRoutes, mountApi } from './plugins/api-routes.ts';
import { EventHub } from './events.ts';
import { streamGuardDeps } from '../core/stream-guard.ts';
import { startPublisher } from './publish.ts';
import { enclaveConfig, enclaveSnapshot, storeSnapshotDocument } from '../pipeline/policy/store-snapshot.ts';
import { reportSkipped } from './skipped-rows.ts';
import { ServiceAccountStatus } from './auth/service-account-status.ts';
import { DcrProvisioner, type IdpProvisioner } from './idp/provisioner.ts';
import { parseServiceAccountKey } from './idp/service-account-key.ts';
import { fetchTrusting } from '../core/fetch.ts';
import type { AuditSink } from '../audit-wal/sink.ts';
import { openAuditReadStore, openAuditSink } from '../audit-wal/open-sink.ts';
import { createRegistry } from '../core/metrics.ts';
import type { Registry } from 'prom-client';
import { controlPlaneMetrics } from './metrics.ts';
import { startUndoSweeper } from './idp/pending-undo.ts';

// `dvx serve controlplane`: the operator API on fastify over TLS.
//
//   skeleton (no issuer or no database): /healthz + a 501 placeholder everywhere else
//   full: migrations, --seed-admin grants, bearer authentication on /api/v1/*, then the routes
//
// Wiring only: this file opens what the plugins use (the store and its migrations, the authenticators,
// the audit sink and reader, the KMS and per-org keys, the event hub) and registers the plugins in
// order (plugins/): problems, health, bearer authentication, the issuer's discovery, every route
// family under /api/v1 (plugins/api-routes.ts; a family whose backing capability is not configured is
// not mounted), the enclave-facing /v1/broker/* routes and the /oauth/token facade.

export interface RunningControlPlane {
  port: number;
  metricsPort: number | null;
  app: FastifyInstance;
  registry: Registry;
  close(): Promise<void>;
}

const SKELETON_DETAIL =
  'the operator API is not yet implemented here: this control plane runs in skeleton mode (configure --oidc-issuer and --database-dsn)';

export async function startControlPlane(
  input: Partial<ControlPlaneOptions>,
  start: { logger?: Logger; audit?: AuditSink; registry?: Registry } = {},
): Promise<RunningControlPlane> {
  const options = validateOptions(input);
  const log = withEnclave(
    start.logger ?? createLogger({ level: options.logLevel, format: options.logFormat, component: 'controlplane' }),
    options,
  );
  const registry = start.registry ?? createRegistry({ defaultMetrics: Boolean(options.metricsAddr) });
  const metrics = controlPlaneMetrics(registry);
  const tls = await loadTls({ cert: options.tlsCert, key: options.tlsKey });
  const listen = parseAddr(options.addr);
  // Connection bounds (core/server-limits.ts); a request node refuses before fastify sees it
  // (oversized headers, malformed, too slow) is answered as a Problem like every other error.
  const limiter = new ServerLimiter(options, {
    listener: 'controlplane',
    registry,
    log,
    answer: (status) => ({
      contentType: PROBLEM_CONTENT_TYPE,
      body: JSON.stringify(problemOf(entryForStatus(status), undefined)),
    }),
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
    logger: false,
    genReqId: () => newId(),
    bodyLimit: 1024 * 1024,
    ...VALIDATION,
  });
  limiter.attach(app.server, { clientErrors: false });

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
  let metricsServer: { port: number; close(): Promise<void> } | null = null;
  // Everything opened is closed in this order, at shutdown and when a later part refuses the start (a
  // port in use, an unreachable store): the store's pool, its LISTEN connection and the WAL's shipper
  // would otherwise keep the process up with nothing listening. The audit sink a caller hands in
  // (start.audit) is closed with the rest, on a failed start too (once its options and TLS files were
  // read). Each step's failure is logged and the next one runs; a second call waits for the first.
  let closing: Promise<void> | null = null;
  const closeOpened = () =>
    (closing ??= (async () => {
      const sink = audit ?? start.audit ?? null;
      const steps: (() => unknown)[] = [
        () => purge && clearInterval(purge),
        () => {
          for (const stop of stopPublishers) stop();
        },
        () => app.close(),
        // An erasure a request started before the listener closed finishes (and records) first.
        () => Promise.allSettled([...erasureJobs]),
        () => metricsServer?.close(),
        () => hub?.close(),
        () => sink?.close(),
        // The WAL sink closes the store it ships to; a store no sink took (start.audit, or a sink that
        // never opened) is closed here.
        () => (auditStore && (closeStore || audit === null) ? auditStore.close() : undefined),
        () => db?.close(),
      ];
      for (const step of steps)
        await Promise.resolve()
          .then(step)
          .catch((err: Error) => log.warn({ err }, 'controlplane shutdown step failed'));
    })());

  try {
    // The server as a list of plugins (docs/decisions.md, "Control-plane store modules and plugins"):
    // problems and the NUL guard, health, then (full mode) bearer authentication, the issuer's discovery,
    // the /api/v1 families, the broker's routes and the token facade.
    await app.register(problems, { log, component: 'controlplane' });
    await app.register(health(enclaveFields(options)));

    if (isSkeleton(options)) {
      app.setNotFoundHandler((req, reply) => sendProblem(reply, PROBLEMS.notImplemented, SKELETON_DETAIL, req.url));
      log.warn(
        { issuer: options.oidcIssuer || null, database: Boolean(options.databaseDsn) },
        'controlplane in skeleton mode',
      );
    } else {
      const issuerCa = options.oidcCa ? await readFile(options.oidcCa) : undefined;
      const idp = options.idpKey ? await openProvisioner(options.idpKey, options.oidcIssuer, issuerCa) : null;
      const kms = options.kmsProvider
        ? await openKms(options.kmsProvider, options.kmsConfig).catch((err: Error) => {
            throw new ControlPlaneOptionsError(err.message, { cause: err });
          })
        : null;
      db = await openDb(options.databaseDsn, {
        onPoolError: (err) => {
          metrics.storeConnectionErrors.inc({ connection: 'pool' });
          log.warn({ err }, 'an idle store connection failed; the pool replaces it');
        },
      });
      const applied = await migrate(db);
      if (applied.length > 0) log.info({ migrations: applied }, 'store migrated');
      for (const subject of options.seedAdmin) await seedPlatformAdmin(db, subject);
      const oidc = new OidcAuthenticator({
        issuer: options.oidcIssuer,
        audience: options.oidcAudience || undefined,
        orgClaim: options.orgClaim,
        ca: issuerCa,
      });
      const accountStatus = new ServiceAccountStatus(db);
      hub = new EventHub();
      await hub.listen(options.databaseDsn, { log, failures: metrics.storeConnectionErrors });
      const events = hub;
      const store = db;
      // A change any replica committed: the grant cache is dropped and open streams re-check at once.
      events.onAuthzChange(() => grantsChanged(store));
      // The hourly purge of consumed events and of deleted enclaves' (spec: Events, fact 3).
      purge = setInterval(
        () =>
          void events
            .purge(store)
            .then((n) => n > 0 && log.info({ purged: n }, 'events purged'))
            .catch((err: Error) => log.warn({ err }, 'event purge failed')),
        3_600_000,
      );
      purge.unref();
      const agentIssuer = options.agentTokenIssuerUrl
        ? await AgentOperatorIssuer.open(store, options.agentTokenIssuerUrl, Math.round(options.agentTokenTtl / 1000))
        : null;
      if (agentIssuer) await app.register(agentIssuerDiscovery(agentIssuer));
      // Audit of every change: the WAL shipped to --audit-dsn, or stdout lines with "stream":"audit".
      // With an audit store, the audit read API reads the store the WAL ships to (one instance of it).
      auditStore = await openAuditReadStore(options, log);
      audit =
        start.audit ?? (await openAuditSink(options, { log, registry, tables: ['audit_events'], store: auditStore }));
      closeStore = Boolean(start.audit) && auditStore !== null; // otherwise the WAL sink closes it
      const capture = { captureOrDeny: options.auditCaptureOrDeny, timeoutMs: options.auditCaptureTimeout };
      await app.register(bearerAuth, { oidc, agentIssuer, accountStatus });
      const keys = kms ? new OrgKeys(store, kms) : null;
      const deps = { db: store, audit: audit!, capture, keys, log, metrics };
      erasureDeps = { db: store, keys, auditStore, audit: audit!, log };
      // IdP undos a failure or a crash left pending (a client registered for an account never stored, …)
      // run again, at start and then periodically (idp/pending-undo.ts).
      if (idp) startUndos = () => startUndoSweeper(deps, idp, options.idpUndoGraceMs);
      // The OpenAPI document describes the full surface, including route families this process did not
      // wire (spec: Versioning): it is collected from a never-listening instance with every family.
      const guard = streamGuardDeps(registry, log, options.streamRecheckMs, options.idleTimeout);
      const document = openApiDocument(
        await surfaceOperations(
          (api) =>
            mountApi(api, deps, {
              agentIssuer: {} as AgentOperatorIssuer,
              idp: {} as IdpProvisioner,
              accountStatus,
              events,
              auditStore: {} as AuditStore,
              auditRead: { pollMs: 0, heartbeatMs: 0, guard, accountStatus },
              erasure: erasureDeps!,
              erasureJobs,
            }),
          VALIDATION,
        ),
      );
      await app.register(
        apiRoutes(deps, document, {
          agentIssuer,
          idp,
          accountStatus,
          events,
          auditStore,
          auditRead: { pollMs: options.auditStreamPollMs, heartbeatMs: 15_000, guard, accountStatus },
          erasure: erasureDeps!,
          erasureJobs,
          idpUndoGraceMs: options.idpUndoGraceMs,
        }),
        { prefix: '/api/v1' },
      );
      await app.register(brokerRoutes(deps, events, { heartbeatMs: options.brokerHeartbeatMs, agentIssuer, guard }));
      if (options.policyPublish) {
        stopPublishers.push(
          await startPublisher({
            db: store,
            hub: events,
            dir: options.policyPublishDir,
            file: 'policy-snapshot.json',
            enclaveId: options.policyEnclaveId,
            org: options.policyOrg,
            build: async (db, id, org) => {
              const s = await enclaveSnapshot(db, id, org);
              if (s) reportSkipped(deps, `enclave:${id}`, s.skipped);
              return s && storeSnapshotDocument(s);
            },
            log,
          }),
        );
      }
      if (options.configPublish) {
        stopPublishers.push(
          await startPublisher({
            db: store,
            hub: events,
            dir: options.configPublishDir,
            file: 'config.json',
            enclaveId: options.configEnclaveId,
            org: options.configOrg,
            build: (db, id, org) => enclaveConfig(db, id, org, keys ? (o, v) => keys.open(o, v) : undefined),
            log,
          }),
        );
      }
      await app.register(
        tokenFacade({ issuer: options.oidcIssuer, override: options.tokenEndpointOverride, ca: issuerCa }),
      );
      app.setNotFoundHandler((req, reply) =>
        sendProblem(reply, PROBLEMS.notFound, `no route ${req.method} ${req.url.split('?')[0]}`, req.url),
      );
    }

    await app.listen({ port: listen.port, host: listen.host ?? '::' });
    metricsServer = options.metricsAddr
      ? await startMetricsServer({
          addr: options.metricsAddr,
          cert: tls.cert,
          key: tls.key,
          registry,
          limits: options,
          log,
        })
      : null;
  } catch (err) {
    await closeOpened();
    throw err;
  }
  if (erasureDeps) {
    // An erasure a crash interrupted runs again from the top (every step is idempotent).
    const deps = erasureDeps;
    const job = resumeErasures(deps).then(
      () => {},
      (err: Error) => deps.log.error({ err }, 'resuming erasures failed'),
    );
    erasureJobs.add(job);
    void job.finally(() => erasureJobs.delete(job));
  }
  const undoSweeper = startUndos?.();
  log.info(
    { addr: app.server.address(), metrics_port: metricsServer?.port ?? null, skeleton: isSkeleton(options) },
    'controlplane listening',
  );
  return {
    port: (app.server.address() as AddressInfo).port,
    metricsPort: metricsServer?.port ?? null,
    app,
    registry,
    close: async () => {
      await Promise.allSettled([...erasureJobs, undoSweeper?.stop()]);
      await closeOpened();
    },
  };
}

/** --enclave-id and --enclave-name as log and /healthz fields, each only when set. */
function enclaveFields(o: ControlPlaneOptions): { enclave_id?: string; enclave_name?: string } {
  return {
    ...(o.enclaveId ? { enclave_id: o.enclaveId } : {}),
    ...(o.enclaveName ? { enclave_name: o.enclaveName } : {}),
  };
}

function withEnclave(log: Logger, o: ControlPlaneOptions): Logger {
  return o.enclaveId || o.enclaveName ? log.child(enclaveFields(o)) : log;
}

/** The service-account provisioner of --idp-key: the key file read and checked against --oidc-issuer. */
async function openProvisioner(file: string, issuer: string, ca: Buffer | undefined): Promise<IdpProvisioner> {
  let key;
  try {
    key = parseServiceAccountKey(JSON.parse(await readFile(file, 'utf8')));
  } catch (err) {
    throw new ControlPlaneOptionsError(`--idp-key ${file}: ${(err as Error).message}`, { cause: err });
  }
  if (key.issuer.replace(/\/+$/, '') !== issuer.replace(/\/+$/, ''))
    throw new ControlPlaneOptionsError(`--idp-key ${file} is a key of ${key.issuer}, not of --oidc-issuer ${issuer}`);
  return new DcrProvisioner(issuer, key, fetchTrusting(ca));
}
