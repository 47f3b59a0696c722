import { readFile } from 'node:fs/promises';
import { availableParallelism } from 'node:os';
import type { Command } from 'commander';
import type { Registry } from 'prom-client';
import { auditOptionsProblem, type AuditOptions } from '../audit-wal/options.ts';
import { OrphanDrainer, workerWalDir } from '../audit-wal/worker-spools.ts';
import { WorkerStartError } from '../core/errors.ts';
import { createLogger, type LogFormat, type Logger, type LogLevel } from '../core/logger.ts';
import { createRegistry } from '../core/metrics.ts';
import { startMetricsServer } from '../core/metrics-server.ts';
import { flag, parsePositiveInt } from '../core/options.ts';
import type { ServerLimitOptions } from '../core/server-limits.ts';
import { runUntilSignal } from '../core/shutdown.ts';
import { ClusterRegistry, leaveCluster, serveAsWorker, WorkerCluster, workerSlot } from '../core/worker-cluster.ts';
import { CliError } from './errors.ts';

// `--workers N` for `dvx serve llmproxy | gateway`: the glue between the command and the supervisor
// (core/worker-cluster.ts). One process (N = 1) runs the server as it always did; several run it in
// cluster workers that share the listening socket, each spooling audit to <audit-wal-dir>/worker-<slot>,
// while the primary supervises them, serves the summed metrics and ships spools left without a writer.

export interface WorkerFlagOptions extends AuditOptions, ServerLimitOptions {
  workers?: number;
  metricsAddr: string;
  tlsCert?: string;
  tlsKey?: string;
  logLevel: LogLevel;
  logFormat: LogFormat;
}

export function addWorkersFlag(command: Command): Command {
  return command.addOption(
    flag('--workers <n>', {
      description:
        'processes sharing the listener, each with its own audit spool; 0 = one per core seen (1 with a pglite:// or stdout audit sink)',
      default: 0,
      parse: parsePositiveInt,
    }),
  );
}

/** How many processes to run: the flag, or one per core where the audit sink allows several writers. */
export function resolveWorkers(o: WorkerFlagOptions): number {
  const asked = o.workers ?? 0;
  const pglite = o.auditDsn.startsWith('pglite:');
  if (pglite && asked > 1)
    throw new CliError(
      `--workers ${asked}: a pglite:// audit store is one process's database; use postgres:// or clickhouse:// to run several workers, or --workers 1`,
    );
  if (asked > 0) return asked;
  // Several processes on one stdout may interleave audit lines longer than a pipe's atomic write, and
  // PGlite cannot be opened twice: both stay one process unless asked.
  if (pglite || !o.auditDsn) return 1;
  return availableParallelism();
}

interface Running {
  close(): Promise<void>;
}

export interface ServeSpec<O extends WorkerFlagOptions, R extends Running> {
  component: 'llmproxy' | 'gateway';
  opts: O;
  /** Checks the options (throws the component's options error), so a bad flag is reported once. */
  validate: (opts: O) => void;
  start: (opts: O, start: { logger?: Logger; registry?: Registry }) => Promise<R>;
  /** The component's start failure as the CliError the command reports. */
  failed: (err: unknown) => CliError;
}

export async function serveWithWorkers<O extends WorkerFlagOptions, R extends Running>(
  spec: ServeSpec<O, R>,
): Promise<void> {
  const slot = workerSlot();
  if (slot !== null) return serveWorker(spec, slot);
  const problem = auditOptionsProblem(spec.opts);
  if (problem) throw new CliError(problem);
  const workers = resolveWorkers(spec.opts);
  if (workers === 1) return serveAlone(spec);
  try {
    spec.validate(spec.opts);
  } catch (err) {
    throw spec.failed(err);
  }
  return servePrimary(spec, workers);
}

function logger(o: WorkerFlagOptions, component: string): Logger {
  return createLogger({ level: o.logLevel, format: o.logFormat, component });
}

/** One process, as before `--workers`; spools of earlier several-worker runs are shipped beside it. */
async function serveAlone<O extends WorkerFlagOptions, R extends Running>(spec: ServeSpec<O, R>): Promise<void> {
  let running: R;
  try {
    running = await spec.start(spec.opts, {});
  } catch (err) {
    throw spec.failed(err);
  }
  const drainer = spec.opts.auditDsn
    ? new OrphanDrainer({
        root: spec.opts.auditWalDir,
        dsn: spec.opts.auditDsn,
        maxBytes: spec.opts.auditWalMaxBytes,
        log: logger(spec.opts, spec.component),
        live: (spool) => spool.slot === null,
      })
    : null;
  drainer?.start();
  // SIGHUP rolls the workers of a cluster (`systemctl reload`); one process has none to roll, and the
  // signal's default action (exit) would stop it without a drain.
  const log = logger(spec.opts, spec.component);
  const hup = () => log.warn('SIGHUP: one process (--workers 1) has no workers to restart; nothing done');
  process.on('SIGHUP', hup);
  await runUntilSignal(async () => {
    await drainer?.stop();
    await running.close();
  });
  process.off('SIGHUP', hup);
}

/** A cluster worker: the server on its own spool, no metrics listener (the primary serves the sum). */
async function serveWorker<O extends WorkerFlagOptions, R extends Running>(
  spec: ServeSpec<O, R>,
  slot: number,
): Promise<void> {
  const log = logger(spec.opts, spec.component).child({ worker: slot });
  const registry = createRegistry({ defaultMetrics: true });
  const opts: O = {
    ...spec.opts,
    metricsAddr: '',
    auditWalDir: spec.opts.auditDsn ? workerWalDir(spec.opts.auditWalDir, slot) : spec.opts.auditWalDir,
  };
  let running: R;
  try {
    running = await spec.start(opts, { logger: log, registry });
  } catch (err) {
    // The open channel to the primary would keep this process alive: let it go, so the worker exits
    // with the command's code and the primary reports the failed start.
    leaveCluster();
    throw spec.failed(err);
  }
  await serveAsWorker({ registry, close: () => running.close(), log });
}

/** The supervisor: forks the workers, serves the summed metrics, rolls on SIGHUP, stops on SIGTERM/SIGINT. */
async function servePrimary<O extends WorkerFlagOptions, R extends Running>(
  spec: ServeSpec<O, R>,
  workers: number,
): Promise<void> {
  const o = spec.opts;
  const log = logger(o, spec.component).child({ worker: 'primary' });
  let cluster: WorkerCluster | null = null;
  const registry = new ClusterRegistry(() => cluster);
  const drainer = o.auditDsn
    ? new OrphanDrainer({
        root: o.auditWalDir,
        dsn: o.auditDsn,
        maxBytes: o.auditWalMaxBytes,
        log,
        live: (spool) => spool.slot !== null && (cluster?.slots().has(spool.slot) ?? true),
      })
    : null;
  try {
    cluster = await WorkerCluster.start({ workers, log, registry, slotBusy: (s) => drainer?.draining(s) ?? false });
  } catch (err) {
    if (err instanceof WorkerStartError) throw new CliError(`${spec.component}: ${err.message}`, err.exitCode);
    throw err;
  }
  const running = cluster;
  drainer?.start();
  let metrics: Awaited<ReturnType<typeof startMetricsServer>> | null = null;
  try {
    metrics = o.metricsAddr
      ? await startMetricsServer({
          addr: o.metricsAddr,
          cert: await readFile(o.tlsCert!),
          key: await readFile(o.tlsKey!),
          registry,
          limits: o,
          log,
        })
      : null;
  } catch (err) {
    await running.stop();
    await drainer?.stop();
    throw new CliError(`${spec.component}: --metrics-addr: ${(err as Error).message}`);
  }
  const roll = () => {
    running.restart().catch((err: Error) => log.error({ err }, 'rolling restart failed'));
  };
  process.on('SIGHUP', roll);
  log.info({ workers, pid: process.pid, metrics_port: metrics?.port ?? null }, `${spec.component} workers ready`);
  await runUntilSignal(async () => {
    process.off('SIGHUP', roll);
    process.on('SIGHUP', () => {}); // stopping: a late SIGHUP must not kill the primary before its workers
    await metrics?.close();
    await running.stop();
    await drainer?.stop();
    log.info(`${spec.component} stopped`);
  });
}
