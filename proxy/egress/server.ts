import https from 'node:https';
import type { AddressInfo } from 'node:net';
import type { Registry } from 'prom-client';
import { parseAddr } from '../../core/addr.ts';
import { createLogger, type Logger } from '../../core/logger.ts';
import { createRegistry } from '../../core/metrics.ts';
import { startMetricsServer, type MetricsServer } from '../../core/metrics-server.ts';
import { ServerLimiter, serverOptions } from '../../core/server-limits.ts';
import { loadTls } from '../../core/tls.ts';
import type { AuditSink } from '../../audit-wal/sink.ts';
import { auditCapture, openAuditSink } from '../../audit-wal/open-sink.ts';
import { InspectionEngine } from '../../pipeline/engine.ts';
import { closeSidecarDispatcher } from '../../pipeline/inspectors/sidecar.ts';
import { PolicyCache } from '../../pipeline/policy/cache.ts';
import { EMPTY_SNAPSHOT } from '../../pipeline/policy/snapshot.ts';
import type { ResolvedPolicy } from '../../pipeline/policy/types.ts';
import { clientErrorAnswer } from '../llm/errors.ts';
import { openAgentAuthenticator, openSecretSource, openSnapshotFile, readCaFlag } from '../llm/sources.ts';
import type { GatewayDeps } from './context.ts';
import { parseDestRule } from './destination.ts';
import { GatewayOptionsError } from './errors.ts';
import { exchangeHandler } from './exchange.ts';
import { Gateway } from './gateway.ts';
import { parseInjectRule } from './inject-cred.ts';
import { openInterceptor } from './intercept.ts';
import { openLlmproxyRoute } from './llmproxy-route.ts';
import { gatewayMetrics } from './metrics.ts';
import { openOperatorTokens } from './operator-tokens.ts';
import { validateGatewayOptions, type GatewayOptions } from './options.ts';
import { LookupLimiter } from './lookup-limits.ts';
import { systemLookup, type Lookup } from './resolve.ts';
import pkg from '../../package.json' with { type: 'json' };

// `dvx serve gateway` (docs/gateway.md): checks the options and rules, opens what the gateway reads
// (TLS, the policy snapshot, secrets, the agents' JWKS), starts the parts (inspection engine, audit
// sink, the interceptor and the routes when configured), then listens. A rule or a source that does
// not hold refuses the start; what was opened before it is closed again.
//
// Shutdown, in order: stop accepting; refuse new attempts on open connections (503); let tunnels and
// requests in flight finish within DRAIN_GRACE_MS, then cut them (both sides of every tunnel) and wait
// for their records to reach the sink; close the interceptor, the routes, the engine and the sources;
// flush and close the audit sink last, so every flow's record is in it.

/** How long open tunnels and requests get to finish at shutdown before they are closed. */
export const DRAIN_GRACE_MS = 5_000;

export interface RunningGateway {
  port: number;
  metricsPort: number | null;
  deps: GatewayDeps;
  /** The bound on name lookups (lookup-limits.ts): how many run and wait now. */
  lookups: LookupLimiter;
  /** Graceful: tunnels get DRAIN_GRACE_MS, audit is flushed. */
  close(): Promise<void>;
}

export interface GatewayStart {
  logger?: Logger;
  registry?: Registry;
  audit?: AuditSink;
  /** Treat `audit` as durable: authority-gated effects wait for their record (capture-or-deny applies). */
  durableAudit?: boolean;
  /** Resolves destination names (tests name what a host resolves to, and see which names were asked). */
  lookup?: Lookup;
  /** Replaces RETIRE_GRACE_MS (gateway.ts): tests see a retired tunnel's requests cut without waiting minutes. */
  retireGraceMs?: number;
}

export async function startGateway(input: Partial<GatewayOptions>, start: GatewayStart = {}): Promise<RunningGateway> {
  const options = validateGatewayOptions(input);
  // Every rule parses before anything opens: one that does not refuses the start, naming it.
  const cliRules = {
    allow: options.allowDest.map((r) => parseDestRule(r, '--allow-dest')),
    deny: options.denyDest.map((r) => parseDestRule(r, '--deny-dest')),
  };
  const injectRules = options.injectCred.map(parseInjectRule);
  let listen: ReturnType<typeof parseAddr>;
  try {
    listen = parseAddr(options.addr);
  } catch (err) {
    throw new GatewayOptionsError(`--addr: ${(err as Error).message}`);
  }
  const log =
    start.logger ?? createLogger({ level: options.logLevel, format: options.logFormat, component: 'gateway' });
  const registry = start.registry ?? createRegistry({ defaultMetrics: true });
  const optionsError = (m: string) => new GatewayOptionsError(m);
  const tls = await loadTls({ cert: options.tlsCert, key: options.tlsKey, ca: options.agentCa || undefined });
  const brokerCa = await readCaFlag('--broker-ca', options.brokerCa, optionsError);
  const upstreamCa = await readCaFlag('--upstream-ca', options.upstreamCa, optionsError);

  // What is open so far, closed in reverse if a later step fails.
  const opened: (() => unknown)[] = [];
  const unwind = async () => {
    for (const close of opened.reverse()) await Promise.resolve(close()).catch(() => {});
  };
  try {
    const policies = new PolicyCache<ResolvedPolicy>();
    // Each reload re-checks every open flow (Gateway.recheck): a tunnel or request the new snapshot
    // refuses (a suspended agent, a new deny rule) is cut, not left running until it ends.
    let reloaded = () => {};
    const snapshotFile = await openSnapshotFile(options.policySnapshot, log, () => {
      policies.invalidate();
      try {
        reloaded();
      } catch (err) {
        log.error({ err }, 'open flows not re-checked after the snapshot reload');
      }
    });
    opened.push(() => snapshotFile?.close());
    const secrets = await openSecretSource(options, brokerCa, log);
    opened.push(() => secrets.close());
    const jwks = await openAgentAuthenticator(options.agentJwks, brokerCa, log);
    opened.push(() => jwks.close());
    const engine = new InspectionEngine({
      timeoutMs: options.inspectTimeout,
      failClosed: options.inspectFailClosed,
      cacheBytes: options.inspectionCacheMb * 1024 * 1024,
      logger: log,
      registry,
    });
    opened.push(() => engine.close());
    // Audit: the WAL shipped to --audit-dsn, or stdout lines with "stream":"audit".
    const audit =
      start.audit ?? (await openAuditSink(options, { log, registry, tables: ['network_flow', 'audit_events'] }));
    opened.push(async () => {
      await audit.flush();
      await audit.close();
    });

    const lookups = new LookupLimiter(start.lookup ?? systemLookup, log);
    const deps: GatewayDeps = {
      options,
      auth: jwks.auth,
      snapshot: () => snapshotFile?.value ?? EMPTY_SNAPSHOT,
      policies,
      secrets: secrets.source,
      engine,
      audit,
      capture: auditCapture(options, start.durableAudit),
      log,
      metrics: gatewayMetrics(registry),
      version: pkg.version,
      cliRules,
      injectRules,
      upstreamCa,
      lookup: lookups.lookup,
      interceptor: null,
      // Replaced below, once every dependency it may read is in place.
      exchange: (req, res) => {
        req.resume();
        res.destroy();
      },
      llmproxy: null,
      operatorTokens: null,
      ...(start.retireGraceMs !== undefined ? { retireGraceMs: start.retireGraceMs } : {}),
    };
    deps.llmproxy = options.llmproxyAddr ? await openLlmproxyRoute(options, log) : null;
    opened.push(() => deps.llmproxy?.close());
    deps.operatorTokens = options.cpApiHost ? await openOperatorTokens(options, log) : null;
    opened.push(() => deps.operatorTokens?.close());
    deps.exchange = exchangeHandler(deps);
    deps.interceptor = options.caCert ? await openInterceptor(deps) : null;
    opened.push(() => deps.interceptor?.close());

    const gateway = new Gateway(deps);
    reloaded = gateway.recheck;
    const limiter = new ServerLimiter(options, { listener: 'gateway', registry, log, answer: clientErrorAnswer });
    const server = https.createServer({
      cert: tls.cert,
      key: tls.key,
      ...(tls.ca ? { ca: tls.ca, requestCert: true, rejectUnauthorized: false } : {}),
      // Slow or silent clients: handshake, headers (a CONNECT that never ends its header included),
      // whole request, keep-alive (core/server-limits.ts).
      ...serverOptions(options),
    });
    limiter.attach(server);
    server.on('connect', gateway.connect);
    server.on('request', gateway.request);
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(listen.port, listen.host, () => resolve());
    });
    opened.push(() => new Promise<void>((resolve) => server.close(() => resolve())));

    const metricsServer: MetricsServer | null = options.metricsAddr
      ? await startMetricsServer({
          addr: options.metricsAddr,
          cert: tls.cert,
          key: tls.key,
          registry,
          limits: options,
          log,
        })
      : null;
    log.info(
      {
        addr: server.address(),
        metrics_port: metricsServer?.port ?? null,
        snapshot: options.policySnapshot || null,
        intercepting: deps.interceptor !== null,
        http_capture: options.httpCapture,
        no_capture_host: options.noCaptureHost,
        allow_dest: cliRules.allow.length,
        deny_dest: cliRules.deny.length,
        inject_cred: injectRules.length,
        llmproxy: options.llmproxyAddr || null,
        llm_host: deps.llmproxy ? options.llmHost : [],
        cp_api_host: options.cpApiHost || null,
      },
      'gateway listening',
    );

    let closing: Promise<void> | null = null;
    return {
      port: (server.address() as AddressInfo).port,
      metricsPort: metricsServer?.port ?? null,
      deps,
      lookups,
      close: () =>
        (closing ??= (async () => {
          const stopped = new Promise<void>((resolve) => server.close(() => resolve()));
          server.closeIdleConnections();
          await gateway.drain(DRAIN_GRACE_MS);
          server.closeAllConnections();
          await stopped;
          await metricsServer?.close();
          await deps.interceptor?.close();
          await deps.llmproxy?.close();
          await deps.operatorTokens?.close();
          await engine.close();
          await closeSidecarDispatcher();
          await secrets.close();
          jwks.close();
          snapshotFile?.close();
          await audit.flush();
          await audit.close();
          log.info('gateway stopped');
        })()),
    };
  } catch (err) {
    await unwind();
    throw err;
  }
}
