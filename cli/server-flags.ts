import type { Command } from 'commander';
import { LOG_FORMATS, LOG_LEVELS, type LogFormat, type LogLevel } from '../core/logger.ts';
import { flag } from '../core/options.ts';

// The flags every server component shares (spec: Server components, "Common flags"), once.
export function addCommonFlags(command: Command, defaults: { addr: string; logFormat: LogFormat; logLevel: LogLevel }): Command {
  return command
    .addOption(flag('--addr <addr>', { description: 'listen address', default: defaults.addr }))
    .addOption(flag('--tls-cert <file>', { description: 'server certificate (PEM); required' }))
    .addOption(flag('--tls-key <file>', { description: 'server private key (PEM); required' }))
    .addOption(flag('--log-format <format>', { description: 'json or text', choices: LOG_FORMATS, default: defaults.logFormat }))
    .addOption(flag('--log-level <level>', { description: 'debug, info, warn or error', choices: LOG_LEVELS, default: defaults.logLevel }));
}
