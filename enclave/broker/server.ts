import { EventEmitter } from 'node:events';
import { mkdir, readFile } from 'node:fs/promises';
import type { AddressInfo } from 'node:net';
import Fastify, { type FastifyInstance } from 'fastify';
import type { Registry } from 'prom-client';
import pkg from '../../package.json' with { type: 'json' };
import type { AuditSink } from '../../audit-wal/sink.ts';
import { openAuditReadStore, openAuditSink } from '../../audit-wal/open-sink.ts';
import { parseAddr } from '../../core/addr.ts';
import { newId } from '../../core/ids.ts';
import { openKms } from '../../core/kms.ts';
import { createLogger, type Logger } from '../../core/logger.ts';
import { startMetricsServer } from '../../core/metrics-server.ts';
import { createRegistry } from '../../core/metrics.ts';
import { OidcAuthenticator } from '../../core/oidc.ts';
import { entryForStatus, PROBLEM_CONTENT_TYPE, PROBLEMS, problemOf, sendProblem } from '../../core/problem.ts';
import { problems } from '../../core/problems-plugin.ts';
import { VALIDATION } from '../../core/schema-errors.ts';
import { ServerLimiter, serverOptions } from '../../core/server-limits.ts';
import { openDb, type Db } from '../../core/sql.ts';
import { loadTls } from '../../core/tls.ts';
import { BrokerOptionsError } from '../errors.ts';
import { agentRoutes, type AgentIdentity, type AgentView } from './agent-routes.ts';
import { approvalOperatorRoutes } from './approvals/operator-routes.ts';
import { approvalsPage } from './approvals/page.ts';
import { startApprovals, type ApprovalLoop } from './approvals/start.ts';
import { startConvergence, type Convergence } from './convergence.ts';
import type { BrokerBus, BrokerDeps } from './deps.ts';
import { EnclaveCa } from './identity/enclave-ca.ts';
import { SigningKeys } from './identity/signing-keys.ts';
import { storeAgentView } from './agent-view.ts';
import { brokerAuditRoutes, noAuditStore } from './operator/audit-routes.ts';
import { operatorAuth } from './operator/auth.ts';
import { grantRoutes } from './operator/grant-routes.ts';
import { seedAdmin } from './operator/grants.ts';
import { secretRoutes } from './operator/secret-routes.ts';
import { validateBrokerOptions, type BrokerOptions } from './options.ts';
import { satelliteRoutes } from './satellite-routes.ts';
import { openSealer } from './sealer.ts';
import { migrate } from './store/migrate.ts';

// `dvx serve broker`: the enclave's control node. It wires the parts over one store and one audit sink:
//
//   agent listener (--addr, :8450)         JWKS, /v1/agent/* (agent-routes.ts), /v1/satellite/* (satellites)
//   operator listener (--operator-addr)    /api/v1/* behind --local-issuer tokens and the enclave's own
//                                          grants: grants, secrets, the enclave's audit, the approvals
//   approvals                              held tool calls: their expiry, the satellites' long-polls
//                                          (approvals/, docs/approvals.md)
//   convergence                            the control plane's events and pulls → the broker's store,
//                                          agent provisioning, status reports (convergence.ts)
//
// Both listeners are TLS only, bounded like every server (core/server-limits.ts), and answer every error
// as a Problem document.

export interface RunningBroker {
  agentPort: number;
  operatorPort: number;
  metricsPort: number | null;
  deps: BrokerDeps;
  /** The platform JWT's keys, the enclave CA and the agents' view of secrets and config. */
  identity: AgentIdentity;
  /** The control plane followed: the last good snapshot and config, agents provisioned, statuses reported. */
  convergence: Convergence;
  /** The approval loop: its expiry sweeper and the satellites' long-polls. */
  approvals: ApprovalLoop;
  agentApp: FastifyInstance;
  operatorApp: FastifyInstance;
  close(): Promise<void>;
}

export interface BrokerStart {
  logger?: Logger;
  /** The audit sink (tests capture records); by default the WAL to --audit-dsn, or stdout. */
  audit?: AuditSink;
  registry?: Registry;
  now?: () => number;
  /** Secrets and config as agents see them; by default over the store and the kept config document (agent-view.ts). */
  agentView?: AgentView;
}

/** One TLS fastify listener with the broker's limits, validation and Problem answers. */
async function listener(
  name: 'broker' | 'broker-operator',
  options: BrokerOptions,
  tls: { cert: Buffer; key: Buffer },
  registry: Registry,
  log: Logger,
): Promise<FastifyInstance> {
  const limiter = new ServerLimiter(options, {
    listener: name,
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
    frameworkErrors: (err, req, reply) => {
      const status = err.code === 'FST_ERR_MAX_PARAM_LENGTH' ? 414 : err.code === 'FST_ERR_BAD_URL' ? 400 : 500;
      if (status === 500) log.error({ err, url: req.url }, `${name} router failed`);
      return sendProblem(reply, entryForStatus(status), err.message, req.url.split('?')[0]!);
    },
    logger: false,
    genReqId: () => newId(),
    bodyLimit: 256 * 1024,
    ...VALIDATION,
  });
  limiter.attach(app.server, { clientErrors: false });
  await app.register(problems, { log, component: name });
  app.get('/healthz', async () => ({
    component: name,
    status: 'ok',
    version: pkg.version,
    ...(options.enclaveId ? { enclave_id: options.enclaveId } : {}),
    ...(options.enclaveName ? { enclave_name: options.enclaveName } : {}),
  }));
  return app;
}

const notFound = (app: FastifyInstance) =>
  app.setNotFoundHandler((req, reply) =>
    sendProblem(reply, PROBLEMS.notFound, `no route ${req.method} ${req.url.split('?')[0]}`, req.url),
  );

export async function startBroker(input: Partial<BrokerOptions>, start: BrokerStart = {}): Promise<RunningBroker> {
  const options = validateBrokerOptions(input);
  const base =
    start.logger ?? createLogger({ level: options.logLevel, format: options.logFormat, component: 'broker' });
  const log =
    options.enclaveId || options.enclaveName
      ? base.child({ enclave_id: options.enclaveId || undefined, enclave_name: options.enclaveName || undefined })
      : base;
  const registry = start.registry ?? createRegistry({ defaultMetrics: Boolean(options.metricsAddr) });
  const tls = await loadTls({ cert: options.tlsCert, key: options.tlsKey });
  await mkdir(options.stateDir, { recursive: true, mode: 0o700 });

  const cleanups: (() => Promise<unknown>)[] = [];
  const closeAll = async () => {
    for (const fn of cleanups.reverse())
      await fn().catch((err: Error) => log.warn({ err }, 'broker shutdown step failed'));
  };
  try {
    const db: Db = await openDb(options.databaseDsn, {
      onPoolError: (err) => log.warn({ err }, 'an idle store connection failed; the pool replaces it'),
    });
    cleanups.push(() => db.close());
    const applied = await migrate(db);
    if (applied.length > 0) log.info({ migrations: applied }, 'broker store migrated');
    const kms = await openKms('local', options.kmsConfig).catch((err: Error) => {
      throw new BrokerOptionsError(err.message, { cause: err });
    });
    const sealer = await openSealer(db, kms);

    // The enclave's audit: the WAL shipped to --audit-dsn (which the operator listener's audit routes
    // also read), or stdout lines with "stream":"audit".
    const auditStore = await openAuditReadStore(options, log);
    const audit =
      start.audit ?? (await openAuditSink(options, { log, registry, tables: ['audit_events'], store: auditStore }));
    cleanups.push(() => audit.close());
    if (start.audit && auditStore) {
      const store = auditStore;
      cleanups.push(() => store.close());
    }

    const bus: BrokerBus = new EventEmitter();
    bus.setMaxListeners(0);
    const deps: BrokerDeps = {
      db,
      log,
      registry,
      options,
      enclave: { id: options.enclaveId, name: options.enclaveName },
      audit,
      capture: { captureOrDeny: options.auditCaptureOrDeny, timeoutMs: options.auditCaptureTimeout, log },
      sealer,
      bus,
      now: start.now ?? Date.now,
    };
    for (const subject of options.seedAdmin) await seedAdmin(db, subject, options.owningOrg);

    // The control plane followed (or, without --controlplane, the store alone): the kept snapshot and
    // config are loaded before any listener opens; pulls, provisioning and status reports run from here
    // on, and a control plane that is away stops nothing.
    const convergence = await startConvergence(deps, {
      controlplane: options.controlplane,
      brokerToken: options.brokerKey,
      ca: options.caCert ? await readFile(options.caCert) : undefined,
    });
    cleanups.push(() => convergence.close());

    // The agent identity: the platform JWT's signing keys (in the store, rotated) and the enclave CA
    // (made on the first start when both of its files are absent).
    const keys = await SigningKeys.open(deps);
    cleanups.push(async () => keys.close());
    const ca = await EnclaveCa.load(
      { cert: options.enclaveCaCert, key: options.enclaveCaKey },
      { commonName: `dvx enclave CA ${options.enclaveName || options.enclaveId || ''}`.trim() },
    );
    if (ca.generated) log.info({ cert: options.enclaveCaCert }, 'enclave CA created');
    const identity: AgentIdentity = {
      keys,
      ca,
      view: start.agentView ?? storeAgentView(deps, () => convergence.config()),
    };

    // The approval loop (its routes on both listeners); closed after them.
    const approvals = startApprovals(deps);
    cleanups.push(() => approvals.close());

    // The agent listener.
    const agentApp = await listener('broker', options, tls, registry, log);
    cleanups.push(() => agentApp.close());
    await agentApp.register(agentRoutes(deps, identity));
    await agentApp.register(await satelliteRoutes(deps, approvals.waits));
    notFound(agentApp);

    // The operator listener: without --local-issuer no operator can authenticate, and every /api/v1
    // path says so.
    const operatorApp = await listener('broker-operator', options, tls, registry, log);
    cleanups.push(() => operatorApp.close());
    if (options.localIssuer) {
      const oidc = new OidcAuthenticator({
        issuer: options.localIssuer,
        audience: options.localAudience || undefined,
        orgClaim: options.orgClaim,
        ca: options.caCert ? await readFile(options.caCert) : undefined,
      });
      await operatorApp.register(operatorAuth, { oidc });
      await operatorApp.register(grantRoutes(deps), { prefix: '/api/v1' });
      // The enclave's audit, read back from --audit-dsn; without a store, a 404 that says so.
      await operatorApp.register(auditStore ? brokerAuditRoutes(deps, auditStore) : noAuditStore, {
        prefix: '/api/v1',
      });
      await operatorApp.register(secretRoutes(deps), { prefix: '/api/v1' });
      await operatorApp.register(approvalOperatorRoutes(deps), { prefix: '/api/v1' });
      // The approvals page for people (no data in it; it reads the routes above with a pasted token).
      await operatorApp.register(approvalsPage);
    } else {
      operatorApp.addHook('onRequest', async (req, reply) => {
        if (req.url.startsWith('/api/v1'))
          return sendProblem(
            reply,
            PROBLEMS.unauthenticated,
            'this broker has no --local-issuer: no operator can authenticate',
            req.url,
          );
      });
    }
    notFound(operatorApp);

    const agentAddr = parseAddr(options.addr);
    const operatorAddr = parseAddr(options.operatorAddr);
    await agentApp.listen({ port: agentAddr.port, host: agentAddr.host ?? '::' });
    await operatorApp.listen({ port: operatorAddr.port, host: operatorAddr.host ?? '::' });
    const metricsServer = options.metricsAddr
      ? await startMetricsServer({
          addr: options.metricsAddr,
          cert: tls.cert,
          key: tls.key,
          registry,
          limits: options,
          log,
        })
      : null;
    if (metricsServer) cleanups.push(() => metricsServer.close());
    const agentPort = (agentApp.server.address() as AddressInfo).port;
    const operatorPort = (operatorApp.server.address() as AddressInfo).port;
    log.info(
      { agent_port: agentPort, operator_port: operatorPort, metrics_port: metricsServer?.port ?? null },
      'broker listening',
    );
    let closed: Promise<void> | null = null;
    return {
      agentPort,
      operatorPort,
      metricsPort: metricsServer?.port ?? null,
      deps,
      identity,
      convergence,
      approvals,
      agentApp,
      operatorApp,
      close: () => (closed ??= closeAll()),
    };
  } catch (err) {
    await closeAll();
    throw err;
  }
}
