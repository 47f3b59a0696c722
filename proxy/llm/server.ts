import https from 'node:https';
import type { AddressInfo } from 'node:net';
import type { Registry } from 'prom-client';
import { parseAddr } from '../../core/addr.ts';
import { createLogger, type Logger } from '../../core/logger.ts';
import { createRegistry } from '../../core/metrics.ts';
import { startMetricsServer } from '../../core/metrics-server.ts';
import { ServerLimiter, serverOptions } from '../../core/server-limits.ts';
import { loadTls } from '../../core/tls.ts';
import { StoreSnapshotSource } from './store-source.ts';
import type { AuditSink } from '../../audit-wal/sink.ts';
import { auditCapture, openAuditSink } from '../../audit-wal/open-sink.ts';
import { InspectionEngine } from '../../pipeline/engine.ts';
import { closeSidecarDispatcher } from '../../pipeline/inspectors/sidecar.ts';
import { PolicyCache } from '../../pipeline/policy/cache.ts';
import { EMPTY_SNAPSHOT } from '../../pipeline/policy/snapshot.ts';
import type { ResolvedPolicy } from '../../pipeline/policy/types.ts';
import { ApprovalsClient } from './approvals-client.ts';
import { BodyBudget } from '../../core/body-budget.ts';
import { RemovedAgents } from './agent-standing.ts';
import { clientErrorAnswer, OptionsError } from './errors.ts';
import { GatewayIdentityVerifier, readVerifyKeys } from './gateway-identity.ts';
import { proxyMetrics } from './metrics.ts';
import { RefusalMemory, type RefusalMemoryOptions } from './tools/refusal-memory.ts';
import { validateOptions, type LlmProxyOptions } from './options.ts';
import { LlmProxy, type ProxyDeps } from './proxy.ts';
import { openAgentAuthenticator, openSecretSource, openSnapshotFile, readCaFlag } from './sources.ts';
import { toolDecider } from './tool-decisions.ts';
import { upstreamDispatcher } from './upstream.ts';
import pkg from '../../package.json' with { type: 'json' };

// `dvx serve llmproxy`: wires the parts (TLS listener, identity, snapshot, secrets, engine, upstream
// pool, audit sink, metrics listener) and shuts them down in order: stop accepting, finish the calls
// in flight, close the engine, flush audit.

export interface RunningProxy {
  port: number;
  metricsPort: number | null;
  proxy: LlmProxy;
  /** Graceful: in-flight calls finish, audit is flushed. */
  close(): Promise<void>;
}

export interface StartOptions {
  logger?: Logger;
  registry?: Registry;
  audit?: AuditSink;
  /** Treat `audit` as durable: answers wait for their record (capture-or-deny applies). */
  durableAudit?: boolean;
  /** The inspection pool's worker module (EngineOptions.workerUrl); tests inject faults with it. */
  inspectWorker?: URL;
  /** Decides the calls' tool calls in place of the caller's llm_policy (ProxyDeps.toolDecider). */
  toolDecider?: ProxyDeps['toolDecider'];
  /** Bounds of the refused-calls memory (tools/refusal-memory.ts); the defaults otherwise. */
  refusalMemory?: RefusalMemoryOptions;
}

export async function startLlmProxy(input: Partial<LlmProxyOptions>, start: StartOptions = {}): Promise<RunningProxy> {
  const options = validateOptions(input);
  const log =
    start.logger ?? createLogger({ level: options.logLevel, format: options.logFormat, component: 'llmproxy' });
  const registry = start.registry ?? createRegistry({ defaultMetrics: true });
  const tls = await loadTls({ cert: options.tlsCert, key: options.tlsKey, ca: options.agentCa || undefined });
  const listen = parseAddr(options.addr);

  const policies = new PolicyCache<ResolvedPolicy>();
  // Each reload drops the resolved policies and re-checks the calls in flight (LlmProxy.recheck, bound
  // once the proxy exists: a reload before that has no call to re-check).
  let recheck = (): void => undefined;
  const reloaded = (): void => {
    policies.invalidate();
    recheck();
  };
  const store = options.databaseDsn
    ? await StoreSnapshotSource.open({
        dsn: options.databaseDsn,
        enclaveId: options.enclaveId,
        log,
        onChange: reloaded,
      })
    : null;
  const snapshotFile = await openSnapshotFile(options.policySnapshot, log, reloaded);
  // The broker's CA: for --secret-broker-url, --approvals-url, and an https --agent-jwks (the broker serves the JWKS).
  const brokerCa = await readCaFlag('--broker-ca', options.brokerCa, (m) => new OptionsError(m));
  const secrets = await openSecretSource(options, brokerCa, log);
  // Tool-call approvals: the broker's satellite approvals routes, with the same satellite token.
  const approvals = options.approvalsUrl
    ? await ApprovalsClient.open({
        url: options.approvalsUrl,
        tokenFile: options.secretBrokerTokenFile,
        ca: brokerCa,
        log,
      })
    : null;

  // The gateway's identity headers (--gateway-key): read once; a new key takes a restart (the file may
  // hold the old key and the new one while the gateway's is rotated).
  const gateway = options.gatewayKey
    ? new GatewayIdentityVerifier(
        await readVerifyKeys(options.gatewayKey, '--gateway-key', (message, cause) => {
          throw new OptionsError(message, { cause });
        }),
      )
    : null;
  const { auth, close: closeJwks } = await openAgentAuthenticator(options.agentJwks, brokerCa, log, gateway);

  const engine = new InspectionEngine({
    timeoutMs: options.inspectTimeout,
    failClosed: options.inspectFailClosed,
    cacheBytes: options.inspectionCacheMb * 1024 * 1024,
    logger: log,
    registry,
    ...(start.inspectWorker ? { workerUrl: start.inspectWorker } : {}),
  });
  const upstreamCa = await readCaFlag('--upstream-ca', options.upstreamCa, (m) => new Error(m));
  const dispatcher = upstreamDispatcher({
    ca: upstreamCa,
    headersTimeoutMs: options.upstreamTimeout,
    bodyTimeoutMs: options.upstreamIdleTimeout,
  });
  // Audit: the WAL shipped to --audit-dsn, or stdout lines with "stream":"audit".
  const audit =
    start.audit ?? (await openAuditSink(options, { log, registry, tables: ['llm_audit_log', 'tool_call_decisions'] }));

  const metrics = proxyMetrics(registry);
  const snapshot = () => store?.value ?? snapshotFile?.value ?? EMPTY_SNAPSHOT;
  const proxy = new LlmProxy({
    options,
    auth,
    snapshot,
    policies,
    secrets: secrets.source,
    engine,
    dispatcher,
    audit,
    approvals,
    log,
    metrics,
    bodies: new BodyBudget(options.maxBufferedBodies, options.maxBufferedBodiesPerAgent, (held) =>
      metrics.bufferedBodies.set(held),
    ),
    refusals: new RefusalMemory(start.refusalMemory),
    removed: new RemovedAgents(snapshot()),
    version: pkg.version,
    // Every answer waits for its record; only a durable sink can refuse one (capture-or-deny).
    capture: auditCapture(options, start.durableAudit),
    toolDecider: start.toolDecider ?? toolDecider,
  });
  recheck = proxy.recheck;

  const limiter = new ServerLimiter(options, { listener: 'llmproxy', registry, log, answer: clientErrorAnswer });
  const server = https.createServer(
    {
      cert: tls.cert,
      key: tls.key,
      ...(tls.ca ? { ca: tls.ca, requestCert: true, rejectUnauthorized: false } : {}),
      // Slow or silent clients: handshake, headers, whole request, keep-alive (core/server-limits.ts).
      ...serverOptions(options),
    },
    proxy.handle,
  );
  limiter.attach(server);
  // What was opened above, closed in order (after the listeners): at shutdown, and when a listener
  // cannot start (a port in use), so that the process exits with the error instead of staying up with
  // nothing listening (the WAL's shipper would keep it alive).
  const release = async () => {
    snapshotFile?.close();
    await store?.close();
    await secrets.close();
    await approvals?.close();
    closeJwks();
    await engine.close();
    await dispatcher.close();
    await closeSidecarDispatcher();
    await audit.flush();
    await audit.close();
  };
  let metricsServer: Awaited<ReturnType<typeof startMetricsServer>> | null = null;
  try {
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(listen.port, listen.host, () => resolve());
    });
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
    server.close();
    await release();
    throw err;
  }
  log.info(
    { addr: server.address(), metrics_port: metricsServer?.port ?? null, snapshot: options.policySnapshot || null },
    'llmproxy listening',
  );

  let closing: Promise<void> | null = null;
  return {
    port: (server.address() as AddressInfo).port,
    metricsPort: metricsServer?.port ?? null,
    proxy,
    close: () =>
      (closing ??= (async () => {
        const stopped = new Promise<void>((resolve) => server.close(() => resolve()));
        server.closeIdleConnections();
        await proxy.drain();
        server.closeAllConnections();
        await stopped;
        await metricsServer?.close();
        await release();
        log.info('llmproxy stopped');
      })()),
  };
}
