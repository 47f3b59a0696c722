import http from 'node:http';
import { readFile } from 'node:fs/promises';
import type { Registry } from 'prom-client';
import { createLogger, type Logger } from '../../core/logger.ts';
import { createRegistry } from '../../core/metrics.ts';
import { startMetricsServer } from '../../core/metrics-server.ts';
import { ServerLimiter, type ServerLimitOptions } from '../../core/server-limits.ts';
import { loadTls } from '../../core/tls.ts';
import { WatchedJsonFile } from '../../core/watched-file.ts';
import type { AuditSink } from '../../audit-wal/sink.ts';
import { auditCapture, openAuditSink } from '../../audit-wal/open-sink.ts';
import { validateConfigDocument, type ConfigDocument } from '../../pipeline/policy/config-values.ts';
import { SecretBroker } from '../llm/secret-broker.ts';
import { parseSecretsFile, secretSource, type SecretMap } from '../llm/secrets-file.ts';
import { CaBundle } from './ca-bundle.ts';
import { errorAnswer, ImdsOptionsError } from './errors.ts';
import { imdsMetrics } from './metrics.ts';
import { validateImdsOptions, type ImdsOptions } from './options.ts';
import { ImdsRoutes } from './routes.ts';
import { listenOnSocket, prepareSocketPath, type BoundSocket } from './socket.ts';

// `dvx serve imds`: the agent's metadata service on a unix socket (spec: Server components, imds row;
// docs/imds.md). Wires the parts and shuts them down in order:
//
//   config snapshot (WatchedJsonFile) ─┐
//   CA bundle (re-read per request)    ├─▶ routes.ts ─▶ plain HTTP/1.1 on --imds-socket (socket.ts)
//   secrets (broker | file) + rules ───┤                 bounded by core/server-limits.ts
//   audit sink (WAL | stdout) ─────────┘
//
// close: stop accepting, answer what is in flight, remove the socket, stop the sources, flush audit.

export interface RunningImds {
  socketPath: string;
  metricsPort: number | null;
  /** Graceful: requests in flight are answered, the socket removed, audit flushed. */
  close(): Promise<void>;
}

export interface ImdsStart {
  logger?: Logger;
  registry?: Registry;
  audit?: AuditSink;
  /** Treat `audit` as durable: a credential waits for its record (capture-or-deny applies). */
  durableAudit?: boolean;
}

export async function startImds(input: Partial<ImdsOptions>, start: ImdsStart = {}): Promise<RunningImds> {
  const options = validateImdsOptions(input);
  const log = start.logger ?? createLogger({ level: options.logLevel, format: options.logFormat, component: 'imds' });
  const registry = start.registry ?? createRegistry({ defaultMetrics: true });
  if (options.addr)
    log.warn(
      { addr: options.addr },
      '--addr is not opened: imds serves on its unix socket only (--imds-socket), whose permissions are its access control',
    );
  if ((options.tlsCert || options.tlsKey) && !options.metricsAddr)
    log.warn('--tls-cert/--tls-key serve only --metrics-addr, which is not set: the imds socket is not TLS');

  // Everything opened is closed again if a later part refuses the start.
  const opened: (() => Promise<void> | void)[] = [];
  const unwind = async () => {
    for (const close of opened.reverse()) await close();
  };
  try {
    const tls = options.metricsAddr ? await loadTls({ cert: options.tlsCert, key: options.tlsKey }) : null;
    let configFile: WatchedJsonFile<ConfigDocument> | null = null;
    if (options.configSnapshot) {
      configFile = await WatchedJsonFile.open({
        path: options.configSnapshot,
        parse: validateConfigDocument,
        onChange: (doc) => log.info({ config_version: doc.version }, 'config snapshot reloaded'),
        onError: (err) => log.error({ err }, 'config snapshot reload refused; keeping the last good one'),
      }).catch((err: Error) => {
        throw new ImdsOptionsError(`--config-snapshot: ${err.message}`, { cause: err });
      });
      const file = configFile;
      opened.push(() => file.close());
    }
    const ca = options.imdsCaCert ? await CaBundle.open(options.imdsCaCert, log) : null;

    let secretsFile: WatchedJsonFile<SecretMap> | null = null;
    if (options.secretsFile) {
      secretsFile = await WatchedJsonFile.open({
        path: options.secretsFile,
        parse: parseSecretsFile,
        onChange: () => log.info('secrets file reloaded'),
        onError: (err) => log.error({ err }, 'secrets file reload refused; keeping the last good one'),
      }).catch((err: Error) => {
        throw new ImdsOptionsError(`--secrets-file: ${err.message}`, { cause: err });
      });
      const file = secretsFile;
      opened.push(() => file.close());
    }
    const brokerCa = options.brokerCa
      ? await readFile(options.brokerCa).catch((err: NodeJS.ErrnoException) => {
          throw new ImdsOptionsError(`cannot read --broker-ca ${options.brokerCa}: ${err.code ?? err.message}`, {
            cause: err,
          });
        })
      : undefined;
    const secretBroker = options.secretBrokerUrl
      ? await SecretBroker.start({
          url: options.secretBrokerUrl,
          tokenFile: options.secretBrokerTokenFile,
          ca: brokerCa,
          log,
        })
      : null;
    if (secretBroker) opened.push(() => secretBroker.close());
    const emptySecrets: SecretMap = new Map();

    const audit = start.audit ?? (await openAuditSink(options, { log, registry, tables: ['audit_events'] }));
    opened.push(async () => {
      await audit.flush();
      await audit.close();
    });

    const routes = new ImdsRoutes({
      who: { agentId: options.agentId, orgId: options.orgId },
      rules: options.rules,
      config: () => configFile?.value ?? null,
      ca,
      secrets: secretSource(() => secretBroker?.map ?? secretsFile?.value ?? emptySecrets),
      secretsReady: () => secretBroker === null || secretBroker.version !== null,
      audit,
      // Only a durable sink can refuse a credential (capture-or-deny); stdout lines are written at once.
      capture: auditCapture(options, start.durableAudit),
      log,
      metrics: imdsMetrics(registry),
    });

    // The socket's bounds: a local client, one per connection (a unix socket has no client address,
    // so the per-client cap is the total cap).
    const limits: ServerLimitOptions = {
      tlsHandshakeTimeout: options.headersTimeout,
      headersTimeout: options.headersTimeout,
      requestTimeout: options.requestTimeout,
      keepAliveTimeout: options.keepAliveTimeout,
      idleTimeout: options.idleTimeout,
      maxConnections: options.maxConnections,
      maxConnectionsPerClient: options.maxConnections,
    };
    const server = http.createServer(
      {
        headersTimeout: limits.headersTimeout,
        requestTimeout: limits.requestTimeout,
        keepAliveTimeout: limits.keepAliveTimeout,
        connectionsCheckingInterval: Math.max(50, Math.min(1000, Math.floor(limits.headersTimeout / 4))),
        // Header bytes a metadata request never comes near; past it, 431.
        maxHeaderSize: 8 * 1024,
      },
      routes.handle,
    );
    new ServerLimiter(limits, {
      listener: 'imds',
      registry,
      log,
      answer: (status, reason) => {
        const a = errorAnswer(status, 'invalid_request_error', `malformed or incomplete request (${reason})`);
        return { contentType: a.contentType, body: a.body.toString() };
      },
    }).attach(server);

    await prepareSocketPath(options.imdsSocket, log);
    const bound: BoundSocket = await listenOnSocket(server, options.imdsSocket, options.imdsSocketMode, log);
    opened.push(async () => {
      await new Promise<void>((resolve) => server.close(() => resolve()));
      await bound.remove();
    });

    const metricsServer =
      options.metricsAddr && tls
        ? await startMetricsServer({ addr: options.metricsAddr, cert: tls.cert, key: tls.key, registry, limits, log })
        : null;
    log.info(
      {
        socket: options.imdsSocket,
        mode: options.imdsSocketMode.toString(8).padStart(4, '0'),
        agent_id: options.agentId,
        rules: options.rules.length,
        config_snapshot: options.configSnapshot || null,
        ca: options.imdsCaCert || null,
        metrics_port: metricsServer?.port ?? null,
      },
      'imds listening',
    );

    let closing: Promise<void> | null = null;
    return {
      socketPath: options.imdsSocket,
      metricsPort: metricsServer?.port ?? null,
      close: () =>
        (closing ??= (async () => {
          const stopped = new Promise<void>((resolve) => server.close(() => resolve()));
          server.closeIdleConnections();
          await routes.drain();
          server.closeAllConnections();
          await stopped;
          await bound.remove();
          await metricsServer?.close();
          configFile?.close();
          secretsFile?.close();
          await secretBroker?.close();
          await audit.flush();
          await audit.close();
          log.info('imds stopped');
        })()),
    };
  } catch (err) {
    await unwind();
    throw err;
  }
}
