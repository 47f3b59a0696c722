import type { Command } from 'commander';
import { Command as Cmd } from 'commander';
import { addBooleanFlag, flag, parseDurationFlag, parsePositiveInt } from '../core/options.ts';
import { runUntilSignal } from '../core/shutdown.ts';
import { CONTROLPLANE_DEFAULTS, OptionsError, type ControlPlaneOptions } from '../controlplane/options.ts';
import { startControlPlane } from '../controlplane/server.ts';
import { CliError } from './exit-codes.ts';
import { addCommonFlags } from './server-flags.ts';

// `dvx serve controlplane`: the operator API (spec: Server components, controlplane row). The flags
// here are the ones built so far; the rest of the row arrives with the features they configure.
export function registerControlPlane(serve: Command): void {
  const d = CONTROLPLANE_DEFAULTS;
  const command = addCommonFlags(new Cmd('controlplane')
    .description('operator API: identity, governance, config, agents, enclaves, audit read'), d)
    .addOption(flag('--oidc-issuer <url>', { description: 'OIDC issuer of operator tokens; empty: skeleton mode', default: d.oidcIssuer }))
    .addOption(flag('--oidc-audience <aud>', { description: 'expected audience of operator tokens', default: d.oidcAudience }))
    .addOption(flag('--oidc-ca <file>', { description: 'extra CA bundle for the issuer', default: d.oidcCa }))
    .addOption(flag('--org-claim <claim>', { description: 'claim holding a token\'s org (dotted path)', default: d.orgClaim }))
    .addOption(flag('--agent-token-issuer-url <url>', { description: 'public base URL of the agent-operator token issuer', default: d.agentTokenIssuerUrl }))
    .addOption(flag('--agent-token-ttl <duration>', { description: 'agent-operator token lifetime; 0 = 60s', default: d.agentTokenTtl, parse: parseDurationFlag }))
    .addOption(flag('--token-endpoint-override <url>', { description: 'token endpoint behind POST /oauth/token (default: <issuer>/oauth/v2/token)', default: d.tokenEndpointOverride }))
    .addOption(flag('--database-dsn <dsn>', { description: 'postgres://… or pglite://DIR; empty: skeleton mode', default: d.databaseDsn }))
    .addOption(flag('--seed-admin <subject>', { description: 'grant this subject the platform administrator role at start (repeatable)', default: [] as string[], parse: undefined }).argParser((v: string, prev: string[] = []) => [...prev, ...v.split(',').map((s) => s.trim()).filter(Boolean)]))
    .addOption(flag('--audit-dsn <dsn>', { description: 'audit store: clickhouse://…, postgres://…, pglite://DIR; empty: stdout', default: d.auditDsn }))
    .addOption(flag('--audit-wal-dir <dir>', { description: 'on-disk audit spool (required with --audit-dsn)', default: d.auditWalDir }))
    .addOption(flag('--audit-wal-max-bytes <bytes>', { description: 'unshipped bytes per table before records are dropped; 0 = 1 GiB', default: d.auditWalMaxBytes, parse: parsePositiveInt }))
    .addOption(flag('--audit-capture-timeout <duration>', { description: 'how long a change waits for its audit record to be durable', default: d.auditCaptureTimeout, parse: parseDurationFlag }))
    .action(async (opts: Partial<ControlPlaneOptions>) => {
      let running;
      try {
        running = await startControlPlane(opts);
      } catch (err) {
        if (err instanceof OptionsError) throw new CliError(err.message);
        throw new CliError(`controlplane failed to start: ${(err as Error).message}`);
      }
      await runUntilSignal(() => running.close());
    });
  addBooleanFlag(command, 'audit-capture-or-deny', 'refuse a change whose audit record cannot be made durable in time', d.auditCaptureOrDeny);
  serve.addCommand(command);
}
