import type { Command } from 'commander';
import { LOG_FORMATS, LOG_LEVELS, type LogFormat, type LogLevel } from '../core/logger.ts';
import { addBooleanFlag, flag, parseDurationFlag, parsePositiveInt } from '../core/options.ts';
import type { AuditOptions } from '../audit-wal/options.ts';

// The flags every server component shares (spec: Server components, "Common flags"), once.
export function addCommonFlags(command: Command, defaults: { addr: string; logFormat: LogFormat; logLevel: LogLevel }): Command {
  return command
    .addOption(flag('--addr <addr>', { description: 'listen address', default: defaults.addr }))
    .addOption(flag('--tls-cert <file>', { description: 'server certificate (PEM); required' }))
    .addOption(flag('--tls-key <file>', { description: 'server private key (PEM); required' }))
    .addOption(flag('--log-format <format>', { description: 'json or text', choices: LOG_FORMATS, default: defaults.logFormat }))
    .addOption(flag('--log-level <level>', { description: 'debug, info, warn or error', choices: LOG_LEVELS, default: defaults.logLevel }));
}

/** The audit durability flags (spec: "Audit durability flags"); `effect` names what waits for the record. */
export function addAuditFlags(command: Command, d: AuditOptions, effect: string): Command {
  command
    .addOption(flag('--audit-dsn <dsn>', { description: 'audit store: clickhouse://[user:pass@]host:port/db, postgres://…, pglite://DIR; empty: stdout', default: d.auditDsn }))
    .addOption(flag('--audit-wal-dir <dir>', { description: 'on-disk audit spool (required with --audit-dsn)', default: d.auditWalDir }))
    .addOption(flag('--audit-wal-max-bytes <bytes>', { description: 'unshipped bytes per table before records are dropped; 0 = 1 GiB', default: d.auditWalMaxBytes, parse: parsePositiveInt }))
    .addOption(flag('--audit-capture-timeout <duration>', { description: `how long ${effect} waits for its audit record to be durable`, default: d.auditCaptureTimeout, parse: parseDurationFlag }));
  return addBooleanFlag(command, 'audit-capture-or-deny', `refuse ${effect} when its audit record cannot be made durable in time`, d.auditCaptureOrDeny);
}
