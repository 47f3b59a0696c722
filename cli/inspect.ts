import { open, readFile } from 'node:fs/promises';
import { Command } from 'commander';
import { createLogger, LOG_LEVELS, type LogLevel } from '../core/logger.ts';
import { addBooleanFlag, flag, parseDurationFlag } from '../core/options.ts';
import { InspectionEngine, MAX_BODY_BYTES, DEFAULT_INSPECT_TIMEOUT_MS } from '../pipeline/engine.ts';
import { closeSidecarDispatcher } from '../pipeline/inspectors/sidecar.ts';
import { PolicyValidationError } from '../pipeline/errors.ts';
import { policyFromDocument } from '../pipeline/policy/resolve.ts';
import { validatePolicyDocument } from '../pipeline/policy/validate.ts';
import type { Phase } from '../pipeline/finding.ts';
import { CliError } from './errors.ts';
import { EXIT_BLOCKED, EXIT_OK, EXIT_UNAVAILABLE } from './exit-codes.ts';

// `dvx inspect --policy FILE [--secrets FILE] [--phase request|response] [BODY_FILE|-]`: the pipeline
// as an offline job (CI pipelines, the benchmark). One JSON finding per line on stdout; logs on stderr.
// Exit 0: nothing blocks; 1: a finding blocks in this phase; 2: bad usage or input; 3: inspection
// failed and --inspect-fail-closed is on.

interface InspectOptions {
  policy: string;
  secrets?: string;
  phase: Phase;
  inspectTimeout: number;
  inspectFailClosed: boolean;
  agentId: string;
  orgId: string;
  agentName: string;
  logLevel: LogLevel;
}

async function readJson(path: string, what: string): Promise<unknown> {
  let text: string;
  try {
    text = await readFile(path, 'utf8');
  } catch (err) {
    throw new CliError(`cannot read ${what} ${path}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`);
  }
  try {
    return JSON.parse(text);
  } catch (err) {
    throw new CliError(`${what} ${path} is not valid JSON: ${(err as Error).message}`);
  }
}

async function readSecrets(path: string): Promise<string[]> {
  const value = await readJson(path, 'secrets file');
  if (!Array.isArray(value) || !value.every((v) => typeof v === 'string')) {
    throw new CliError(`secrets file ${path} must be a JSON array of strings`);
  }
  return value;
}

/** Reads the body (a file, or stdin for `-`), refusing anything past the 32 MB proxy limit. */
export async function readBody(source: string): Promise<Buffer> {
  const tooLarge = () => new CliError(`body exceeds the ${MAX_BODY_BYTES}-byte (32 MB) limit`);
  let stream: AsyncIterable<Buffer>;
  let close = async () => {};
  if (source === '-') {
    stream = process.stdin;
  } else {
    let handle;
    try {
      handle = await open(source, 'r');
    } catch (err) {
      throw new CliError(
        `cannot read body ${source}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`,
      );
    }
    const size = (await handle.stat()).size;
    if (size > MAX_BODY_BYTES) {
      await handle.close();
      throw tooLarge();
    }
    stream = handle.createReadStream();
    close = () => handle.close().catch(() => {}); // the body is read; a failed close loses nothing
  }
  const chunks: Buffer[] = [];
  let total = 0;
  try {
    for await (const chunk of stream) {
      total += chunk.length;
      if (total > MAX_BODY_BYTES) throw tooLarge();
      chunks.push(chunk);
    }
  } catch (err) {
    if (err instanceof CliError) throw err;
    throw new CliError(`cannot read body ${source}: ${(err as Error).message}`);
  } finally {
    await close();
  }
  return Buffer.concat(chunks, total);
}

export function inspectCommand(): Command {
  const command = new Command('inspect')
    .description('inspect one LLM request or response body against a policy; one JSON finding per line')
    .argument('[body]', 'body file, or - for stdin', '-')
    .addOption(
      flag('--policy <file>', {
        description: 'JSON object with any of model_policy, content_inspection, sidecar_inspection',
      }).makeOptionMandatory(),
    )
    .addOption(flag('--secrets <file>', { description: "JSON array of the agent's secret values" }))
    .addOption(
      flag('--phase <phase>', {
        description: 'request or response',
        choices: ['request', 'response'],
        default: 'request',
      }),
    )
    .addOption(
      flag('--inspect-timeout <duration>', {
        description: 'deadline around the whole run',
        default: DEFAULT_INSPECT_TIMEOUT_MS,
        parse: parseDurationFlag,
      }),
    )
    .addOption(flag('--agent-id <id>', { description: 'agent id sent to sidecars', default: '0' }))
    .addOption(flag('--org-id <id>', { description: 'organization id sent to sidecars', default: '0' }))
    .addOption(flag('--agent-name <name>', { description: 'agent name sent to sidecars', default: '' }))
    .addOption(
      flag('--log-level <level>', {
        description: 'log level (logs go to stderr)',
        choices: LOG_LEVELS,
        default: 'warn',
      }),
    )
    .action(async (bodySource: string, options: InspectOptions) => {
      process.exitCode = await runInspect(bodySource, options);
    });
  return addBooleanFlag(command, 'inspect-fail-closed', 'exit 3 instead of passing when inspection fails', false);
}

async function runInspect(bodySource: string, options: InspectOptions): Promise<number> {
  let policy;
  try {
    policy = policyFromDocument(validatePolicyDocument(await readJson(options.policy, 'policy')));
  } catch (err) {
    if (err instanceof PolicyValidationError) throw new CliError(`invalid policy ${options.policy}: ${err.message}`);
    throw err;
  }
  const secrets = options.secrets ? await readSecrets(options.secrets) : [];
  const body = await readBody(bodySource);
  const logger = createLogger({ level: options.logLevel, destination: process.stderr as never, component: 'inspect' });
  // One body, one process: inline is cheaper than starting a worker pool.
  const engine = new InspectionEngine({
    timeoutMs: options.inspectTimeout,
    failClosed: options.inspectFailClosed,
    threads: 0,
    logger,
  });
  try {
    const outcome = await engine.inspect({
      body,
      phase: options.phase,
      policy,
      secrets,
      identity: { agentId: options.agentId, orgId: options.orgId, agentName: options.agentName },
    });
    process.stdout.write(outcome.findings.map((f) => JSON.stringify(f) + '\n').join(''));
    if (outcome.decision === 'unavailable') {
      process.stderr.write(
        'dvx inspect: inspection unavailable (fail closed): ' +
          outcome.failures.map((f) => `${f.inspector}: ${f.reason}`).join('; ') +
          '\n',
      );
      return EXIT_UNAVAILABLE;
    }
    return outcome.decision === 'block' ? EXIT_BLOCKED : EXIT_OK;
  } finally {
    await engine.close();
    await closeSidecarDispatcher();
  }
}
