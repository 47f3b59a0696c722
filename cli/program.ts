import { Command, CommanderError } from 'commander';
import { inspectCommand } from './inspect.ts';
import { serveCommand } from './serve.ts';
import { devCommand } from './dev.ts';
import { walCommand } from './wal.ts';
import { configPullCommand, policyPullCommand, waitFileCommand } from './pull.ts';
import { agentLoginCommand } from './agent-login.ts';
import { CliError, ProblemAnswerError } from './errors.ts';
import { whoamiCommand } from './commands/whoami.ts';
import { profileCommand } from './commands/profile.ts';
import { orgsCommand } from './commands/orgs.ts';
import { groupsCommand } from './commands/groups.ts';
import { membersCommand } from './commands/members.ts';
import { rolesCommand } from './commands/roles.ts';
import { grantCommand } from './commands/grant.ts';
import { serviceAccountsCommand } from './commands/service-accounts.ts';
import { idpConnectorsCommand } from './commands/idp-connectors.ts';
import { enclavesCommand } from './commands/enclaves.ts';
import { agentCommand } from './commands/agent.ts';
import { erasureCommand } from './commands/erasure.ts';
import { openapiCommand } from './commands/openapi.ts';
import { completionCommand } from './commands/completion.ts';
import { policyCommand } from './commands/policy.ts';
import { configCommand } from './commands/config.ts';
import { flagsCommand } from './commands/flags.ts';
import { packsCommand } from './commands/packs.ts';
import { secretCommand } from './commands/secret.ts';
import { approvalsCommand } from './commands/approvals.ts';
import { auditCommand } from './commands/audit.ts';
import { EXIT_USAGE } from './exit-codes.ts';
import pkg from '../package.json' with { type: 'json' };

export function buildProgram(): Command {
  const program = new Command('dvx')
    .description('dvx: governance for autonomous AI agents (inspection proxies, audit, control plane)')
    .version(pkg.version)
    .showHelpAfterError('(run with --help for usage)')
    .exitOverride();
  program.addCommand(serveCommand());
  program.addCommand(inspectCommand());
  program.addCommand(devCommand());
  program.addCommand(walCommand());
  program.addCommand(policyPullCommand());
  program.addCommand(configPullCommand());
  program.addCommand(waitFileCommand());
  program.addCommand(agentLoginCommand());
  // Operator commands (docs/cli.md).
  program.addCommand(whoamiCommand());
  program.addCommand(profileCommand());
  program.addCommand(orgsCommand());
  program.addCommand(groupsCommand());
  program.addCommand(membersCommand());
  program.addCommand(rolesCommand());
  program.addCommand(grantCommand());
  program.addCommand(serviceAccountsCommand());
  program.addCommand(idpConnectorsCommand());
  program.addCommand(enclavesCommand());
  program.addCommand(agentCommand());
  program.addCommand(erasureCommand());
  program.addCommand(openapiCommand());
  program.addCommand(completionCommand());
  program.addCommand(policyCommand());
  program.addCommand(configCommand());
  program.addCommand(flagsCommand());
  program.addCommand(packsCommand());
  program.addCommand(secretCommand());
  program.addCommand(approvalsCommand());
  program.addCommand(auditCommand());
  const all = (c: Command): Command[] => [c, ...c.commands.flatMap(all)];
  for (const c of all(program)) {
    c.exitOverride();
    c.showHelpAfterError('(run with --help for usage)');
  }
  return program;
}

/** Runs the CLI; returns the exit code. Usage errors exit 2, never with a stack trace. */
export async function run(argv: string[]): Promise<number> {
  const program = buildProgram();
  try {
    await program.parseAsync(argv, { from: 'user' });
    return typeof process.exitCode === 'number' ? process.exitCode : 0;
  } catch (err) {
    if (err instanceof CommanderError) {
      if (err.code === 'commander.helpDisplayed' || err.code === 'commander.version' || err.code === 'commander.help')
        return 0;
      return EXIT_USAGE; // commander already printed the message
    }
    if (err instanceof ProblemAnswerError) {
      process.stderr.write(`dvx: ${err.message}\n`);
      return err.exitCode;
    }
    if (err instanceof CliError) {
      process.stderr.write(`dvx: ${err.message.replace(/^dvx[^:]*: /, '')}\n`);
      return err.exitCode;
    }
    process.stderr.write(`dvx: unexpected error: ${(err as Error).stack ?? String(err)}\n`);
    return 70;
  }
}
