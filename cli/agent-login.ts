import { readFile } from 'node:fs/promises';
import { Command } from 'commander';
import { createLogger, LOG_FORMATS, LOG_LEVELS, type LogFormat, type LogLevel } from '../core/logger.ts';
import { addBooleanFlag, flag } from '../core/options.ts';
import { runAgentLogin } from '../enclave/agent-login.ts';
import { AgentLoginInputError, AgentLoginRefusedError, AgentLoginUnavailableError } from '../enclave/errors.ts';
import { CliError } from './errors.ts';
import { EXIT_OK, EXIT_REFUSED, EXIT_UNAVAILABLE, EXIT_USAGE } from './exit-codes.ts';

// dvx agent-login --broker URL --token-file FILE --out DIR [--ca-cert FILE] [--csr] [--once]
//
// The agent-side helper of the broker's exchanges (enclave/agent-login.ts, docs/agent-login.md). Exit 0:
// stopped by SIGTERM/SIGINT, or --once done; 2: bad usage or input (the token file missing or empty);
// 3: the broker stayed unreachable until the JWT expired; 4: the broker refused the agent for good.

interface AgentLoginFlags {
  broker?: string;
  tokenFile?: string;
  out?: string;
  caCert: string;
  csr: boolean;
  once: boolean;
  logFormat: LogFormat;
  logLevel: LogLevel;
}

export function agentLoginCommand(): Command {
  const command = new Command('agent-login')
    .description(
      "redeem the agent's bootstrap token at the broker, then keep its JWT, config and secrets renewed as files under --out",
    )
    .addOption(flag('--broker <url>', { description: "the broker's agent listener (https://host:8450)" }))
    .addOption(
      flag('--token-file <file>', {
        description: 'the bootstrap token the broker wrote for this agent (<agent-host-dir>/<uid>/bootstrap-token)',
      }),
    )
    .addOption(
      flag('--out <dir>', { description: 'where jwt, refresh-token, config.json, secrets/ … are kept (0700)' }),
    )
    .addOption(flag('--ca-cert <file>', { description: 'CA bundle to trust for the broker', default: '' }))
    .addOption(flag('--log-format <format>', { description: 'json or text', default: 'json', choices: LOG_FORMATS }))
    .addOption(flag('--log-level <level>', { description: 'log level', default: 'info', choices: LOG_LEVELS }));
  addBooleanFlag(
    command,
    'csr',
    'also ask for a 5-minute identity certificate (cert.pem) for a P-256 key made under --out (key.pem)',
    false,
  );
  addBooleanFlag(command, 'once', 'one exchange (a bootstrap, or a refresh when one is on disk), then exit', false);
  command.action(async (o: AgentLoginFlags) => {
    for (const [name, v] of [
      ['--broker', o.broker],
      ['--token-file', o.tokenFile],
      ['--out', o.out],
    ] as const)
      if (!v) throw new CliError(`${name} is required`);
    let ca: Buffer | undefined;
    if (o.caCert) {
      try {
        ca = await readFile(o.caCert);
      } catch (err) {
        throw new CliError(`cannot read --ca-cert ${o.caCert}: ${(err as NodeJS.ErrnoException).code ?? 'error'}`);
      }
    }
    const log = createLogger({ level: o.logLevel, format: o.logFormat, component: 'agent-login' });
    const stop = new AbortController();
    const onSignal = () => {
      log.info('stopping (an exchange in flight is finished first)');
      stop.abort();
    };
    process.on('SIGTERM', onSignal);
    process.on('SIGINT', onSignal);
    try {
      await runAgentLogin({
        broker: o.broker!,
        tokenFile: o.tokenFile!,
        out: o.out!,
        ca,
        csr: o.csr,
        once: o.once,
        log,
        signal: stop.signal,
      });
      process.exitCode = EXIT_OK;
    } catch (err) {
      const exitCode =
        err instanceof AgentLoginRefusedError
          ? EXIT_REFUSED
          : err instanceof AgentLoginUnavailableError
            ? EXIT_UNAVAILABLE
            : err instanceof AgentLoginInputError
              ? EXIT_USAGE
              : null;
      if (exitCode === null) throw err;
      log.error({ err }, 'agent-login stopped');
      throw new CliError((err as Error).message, exitCode, { cause: err });
    } finally {
      process.off('SIGTERM', onSignal);
      process.off('SIGINT', onSignal);
    }
  });
  return command;
}
