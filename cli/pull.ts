import { readFile, stat } from 'node:fs/promises';
import { Command } from 'commander';
import { addBooleanFlag, flag, parseDurationFlag } from '../core/options.ts';
import { createLogger, type LogFormat, type LogLevel } from '../core/logger.ts';
import { runUntilSignal } from '../core/shutdown.ts';
import { validateSnapshot } from '../pipeline/policy/snapshot.ts';
import { startPuller } from '../enclave/pullers/puller.ts';
import { CliError } from './errors.ts';
import { EXIT_BLOCKED, EXIT_OK } from './exit-codes.ts';

// The pull sidecars and their helper:
//   dvx policy-pull  --controlplane URL --broker-key FILE --snapshot FILE [--interval 30s] [--no-events]
//   dvx config-pull  (the same, for config values)
//   dvx wait-file    --path FILE [--poll 2s] [--timeout 10m]   (exit 0 once it exists, 1 on timeout)

interface PullFlags {
  controlplane: string;
  brokerKey: string;
  snapshot: string;
  interval: number;
  events: boolean;
  caCert: string;
  insecureSkipVerify: boolean;
  logFormat: LogFormat;
  logLevel: LogLevel;
}

/** The broker key file: registerBrokerView's `key` (`{"type":"broker_key","token":…}`) or the bare token. */
export async function readBrokerToken(file: string): Promise<string> {
  let text: string;
  try {
    text = (await readFile(file, 'utf8')).trim();
  } catch (err) {
    throw new CliError(
      `cannot read --broker-key ${file}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`,
    );
  }
  if (text.startsWith('{')) {
    let doc: { token?: unknown; key?: { token?: unknown } };
    try {
      doc = JSON.parse(text);
    } catch {
      throw new CliError(`--broker-key ${file} is not valid JSON`);
    }
    const token = doc.token ?? doc.key?.token;
    if (typeof token !== 'string' || !token) throw new CliError(`--broker-key ${file} holds no token`);
    return token;
  }
  if (!text) throw new CliError(`--broker-key ${file} is empty`);
  return text;
}

function pullCommand(name: string, route: string, description: string, validate?: (doc: unknown) => void): Command {
  const command = new Command(name)
    .description(description)
    .addOption(flag('--controlplane <url>', { description: 'base URL of the control plane' }))
    .addOption(
      flag('--broker-key <file>', {
        description: "the enclave's broker key (registerBrokerView.key, or the bare token)",
      }),
    )
    .addOption(flag('--snapshot <file>', { description: 'where to write the state (replaced atomically)' }))
    .addOption(
      flag('--interval <duration>', {
        description: 'pull interval (also with events, as a safety net)',
        default: 30_000,
        parse: parseDurationFlag,
      }),
    )
    .addOption(flag('--ca-cert <file>', { description: 'CA bundle to trust for the control plane', default: '' }))
    .addOption(
      flag('--log-format <format>', { description: 'json or text', default: 'json', choices: ['json', 'text'] }),
    )
    .addOption(
      flag('--log-level <level>', {
        description: 'log level',
        default: 'info',
        choices: ['debug', 'info', 'warn', 'error'],
      }),
    );
  addBooleanFlag(command, 'events', "follow the control plane's event stream and pull on every nudge", true);
  addBooleanFlag(
    command,
    'insecure-skip-verify',
    "do not verify the control plane's certificate (development only)",
    false,
  );
  command.action(async (o: PullFlags) => {
    for (const [flagName, v] of [
      ['--controlplane', o.controlplane],
      ['--broker-key', o.brokerKey],
      ['--snapshot', o.snapshot],
    ] as const) {
      if (!v) throw new CliError(`${flagName} is required`);
    }
    if (!/^https?:\/\//.test(o.controlplane)) throw new CliError('--controlplane must be an http(s) URL');
    if (!(o.interval > 0)) throw new CliError('--interval must be positive');
    const log = createLogger({ level: o.logLevel, format: o.logFormat, component: name });
    const puller = startPuller({
      controlplane: o.controlplane,
      route,
      brokerToken: await readBrokerToken(o.brokerKey),
      out: o.snapshot,
      intervalMs: o.interval,
      events: o.events,
      ca: o.caCert ? await readFile(o.caCert) : undefined,
      insecureSkipVerify: o.insecureSkipVerify,
      validate,
      log,
    });
    await runUntilSignal(() => puller.close());
  });
  return command;
}

export function policyPullCommand(): Command {
  return pullCommand(
    'policy-pull',
    '/v1/broker/snapshot',
    "write the enclave's policy snapshot (docs/snapshot.md) and keep it current",
    (doc) => void validateSnapshot(doc),
  );
}

export function configPullCommand(): Command {
  return pullCommand('config-pull', '/v1/broker/config', "write the enclave's config values and keep them current");
}

export function waitFileCommand(): Command {
  return new Command('wait-file')
    .description('wait until a file exists and is not empty (exit 0), or time out (exit 1)')
    .addOption(flag('--path <file>', { description: 'the file to wait for' }))
    .addOption(flag('--poll <duration>', { description: 'how often to look', default: 2000, parse: parseDurationFlag }))
    .addOption(
      flag('--timeout <duration>', { description: 'give up after', default: 600_000, parse: parseDurationFlag }),
    )
    .action(async (o: { path?: string; poll: number; timeout: number }) => {
      if (!o.path) throw new CliError('--path is required');
      const until = Date.now() + o.timeout;
      for (;;) {
        const s = await stat(o.path).catch(() => null); // not there yet: keep polling
        if (s?.isFile() && s.size > 0) {
          process.exitCode = EXIT_OK;
          return;
        }
        if (Date.now() >= until) {
          process.stderr.write(`dvx: ${o.path} did not appear within the timeout\n`);
          process.exitCode = EXIT_BLOCKED;
          return;
        }
        await new Promise((r) => setTimeout(r, Math.max(10, Math.min(o.poll || 10, until - Date.now()))));
      }
    });
}
