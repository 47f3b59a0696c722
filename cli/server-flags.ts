import type { Command } from 'commander';
import { LOG_FORMATS, LOG_LEVELS, type LogFormat, type LogLevel } from '../core/logger.ts';
import { addBooleanFlag, flag, parseDurationFlag, parsePositiveInt } from '../core/options.ts';
import type { AuditOptions } from '../audit-wal/options.ts';
import type { ServerLimitOptions } from '../core/server-limits.ts';

// The flags every server component shares (spec: Server components, "Common flags"), once.
export function addCommonFlags(
  command: Command,
  defaults: { addr: string; logFormat: LogFormat; logLevel: LogLevel },
): Command {
  return command
    .addOption(flag('--addr <addr>', { description: 'listen address', default: defaults.addr }))
    .addOption(flag('--tls-cert <file>', { description: 'server certificate (PEM); required' }))
    .addOption(flag('--tls-key <file>', { description: 'server private key (PEM); required' }))
    .addOption(
      flag('--log-format <format>', { description: 'json or text', choices: LOG_FORMATS, default: defaults.logFormat }),
    )
    .addOption(
      flag('--log-level <level>', {
        description: 'debug, info, warn or error',
        choices: LOG_LEVELS,
        default: defaults.logLevel,
      }),
    );
}

/**
 * The other common flags (spec: Server components, "Common flags"): the metrics listener and the enclave
 * this component serves; `enclave` says what an empty id or name means for it.
 */
export function addMetricsAndEnclaveFlags(
  command: Command,
  d: { metricsAddr: string; enclaveId: string; enclaveName: string },
  enclave: { id: string; name: string },
): Command {
  return command
    .addOption(
      flag('--metrics-addr <addr>', {
        description: 'TLS Prometheus listener; empty disables it',
        default: d.metricsAddr,
      }),
    )
    .addOption(flag('--enclave-id <id>', { description: enclave.id, default: d.enclaveId }))
    .addOption(flag('--enclave-name <name>', { description: enclave.name, default: d.enclaveName }));
}

/** The audit durability flags (spec: "Audit durability flags"); `effect` names what waits for the record. */
export function addAuditFlags(command: Command, d: AuditOptions, effect: string): Command {
  command
    .addOption(
      flag('--audit-dsn <dsn>', {
        description: 'audit store: clickhouse://[user:pass@]host:port/db, postgres://…, pglite://DIR; empty: stdout',
        default: d.auditDsn,
      }),
    )
    .addOption(
      flag('--audit-wal-dir <dir>', {
        description: 'on-disk audit spool (required with --audit-dsn)',
        default: d.auditWalDir,
      }),
    )
    .addOption(
      flag('--audit-wal-max-bytes <bytes>', {
        description: 'unshipped bytes per table before records are dropped; 0 = 1 GiB',
        default: d.auditWalMaxBytes,
        parse: parsePositiveInt,
      }),
    )
    .addOption(
      flag('--audit-capture-timeout <duration>', {
        description: `how long ${effect} waits for its audit record to be durable`,
        default: d.auditCaptureTimeout,
        parse: parseDurationFlag,
      }),
    );
  return addBooleanFlag(
    command,
    'audit-capture-or-deny',
    `refuse ${effect} when its audit record cannot be made durable in time`,
    d.auditCaptureOrDeny,
  );
}

/** The connection bounds of every TLS listener (core/server-limits.ts). */
export function addConnectionFlags(command: Command, d: ServerLimitOptions): Command {
  return command
    .addOption(
      flag('--tls-handshake-timeout <duration>', {
        description: 'time from accept to a completed TLS handshake',
        default: d.tlsHandshakeTimeout,
        parse: parseDurationFlag,
      }),
    )
    .addOption(
      flag('--headers-timeout <duration>', {
        description: 'time to receive a complete request header',
        default: d.headersTimeout,
        parse: parseDurationFlag,
      }),
    )
    .addOption(
      flag('--request-timeout <duration>', {
        description: 'time to receive a whole request, body included',
        default: d.requestTimeout,
        parse: parseDurationFlag,
      }),
    )
    .addOption(
      flag('--keep-alive-timeout <duration>', {
        description: 'idle time between two requests on one connection',
        default: d.keepAliveTimeout,
        parse: parseDurationFlag,
      }),
    )
    .addOption(
      flag('--idle-timeout <duration>', {
        description:
          'a connection with no traffic and no response in flight is closed after this, and one whose client takes none of its response for this long',
        default: d.idleTimeout,
        parse: parseDurationFlag,
      }),
    )
    .addOption(
      flag('--max-connections <n>', {
        description: 'open connections per listener; more are closed at accept',
        default: d.maxConnections,
        parse: parsePositiveInt,
      }),
    )
    .addOption(
      flag('--max-connections-per-client <n>', {
        description: 'open connections per client address; more are closed at accept',
        default: d.maxConnectionsPerClient,
        parse: parsePositiveInt,
      }),
    );
}

/** `--seed-admin SUBJECT`, repeatable (and comma-separated); `grants` says what the subject gets. */
export function addSeedAdminFlag(command: Command, grants: string): Command {
  return command.addOption(
    flag('--seed-admin <subject>', {
      description: `grant this subject ${grants} at start (repeatable)`,
      default: [] as string[],
      parse: undefined,
    }).argParser((v: string, prev: string[] = []) => [
      ...prev,
      ...v
        .split(',')
        .map((s) => s.trim())
        .filter(Boolean),
    ]),
  );
}
