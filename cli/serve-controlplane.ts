import type { Command } from 'commander';
import { Command as Cmd } from 'commander';
import { addBooleanFlag, flag, parseDurationFlag } from '../core/options.ts';
import { runUntilSignal } from '../core/shutdown.ts';
import { CONTROLPLANE_DEFAULTS, type ControlPlaneOptions } from '../controlplane/options.ts';
import { ControlPlaneOptionsError } from '../controlplane/errors.ts';
import { CliError } from './errors.ts';
import {
  addAuditFlags,
  addCommonFlags,
  addConnectionFlags,
  addMetricsAndEnclaveFlags,
  addSeedAdminFlag,
} from './server-flags.ts';

// `dvx serve controlplane`: the operator API (spec: Server components, controlplane row). The flags
// here are the ones built so far; the rest of the row arrives with the features they configure.
export function registerControlPlane(serve: Command): void {
  const d = CONTROLPLANE_DEFAULTS;
  const command = addCommonFlags(
    new Cmd('controlplane').description('operator API: identity, governance, config, agents, enclaves, audit read'),
    d,
  )
    .addOption(
      flag('--oidc-issuer <url>', {
        description: 'OIDC issuer of operator tokens; empty: skeleton mode',
        default: d.oidcIssuer,
      }),
    )
    .addOption(
      flag('--oidc-audience <aud>', { description: 'expected audience of operator tokens', default: d.oidcAudience }),
    )
    .addOption(flag('--oidc-ca <file>', { description: 'extra CA bundle for the issuer', default: d.oidcCa }))
    .addOption(
      flag('--org-claim <claim>', { description: "claim holding a token's org (dotted path)", default: d.orgClaim }),
    )
    .addOption(
      flag('--agent-token-issuer-url <url>', {
        description: 'public base URL of the agent-operator token issuer',
        default: d.agentTokenIssuerUrl,
      }),
    )
    .addOption(
      flag('--agent-token-ttl <duration>', {
        description: 'agent-operator token lifetime; 0 = 60s',
        default: d.agentTokenTtl,
        parse: parseDurationFlag,
      }),
    )
    .addOption(
      flag('--token-endpoint-override <url>', {
        description: 'token endpoint behind POST /oauth/token (default: <issuer>/oauth/v2/token)',
        default: d.tokenEndpointOverride,
      }),
    )
    .addOption(
      flag('--idp-key <file>', {
        description:
          "the control plane's service-account key at the IdP (provisions service accounts by dynamic client registration)",
        default: d.idpKey,
      }),
    )
    .addOption(
      flag('--policy-publish-dir <dir>', {
        description: 'with --policy-publish: where policy-snapshot.json is written',
        default: d.policyPublishDir,
      }),
    )
    .addOption(
      flag('--policy-org <org>', {
        description: 'with --policy-publish: narrow the snapshot to one org',
        default: d.policyOrg,
      }),
    )
    .addOption(
      flag('--policy-enclave-id <id>', {
        description: 'with --policy-publish: the co-located enclave',
        default: d.policyEnclaveId,
      }),
    )
    .addOption(
      flag('--config-publish-dir <dir>', {
        description: 'with --config-publish: where config.json is written',
        default: d.configPublishDir,
      }),
    )
    .addOption(
      flag('--config-org <org>', {
        description: 'with --config-publish: narrow the values to one org',
        default: d.configOrg,
      }),
    )
    .addOption(
      flag('--config-enclave-id <id>', {
        description: 'with --config-publish: the co-located enclave',
        default: d.configEnclaveId,
      }),
    )
    .addOption(
      flag('--kms-provider <provider>', {
        description: 'KMS wrapping the per-org data keys (local); empty: values stored unsealed',
        default: d.kmsProvider,
      }),
    )
    .addOption(
      flag('--kms-config <file>', {
        description: 'local KMS: the master key file (created 0600 if absent)',
        default: d.kmsConfig,
      }),
    )
    .addOption(
      flag('--database-dsn <dsn>', {
        description: 'postgres://… or pglite://DIR; empty: skeleton mode',
        default: d.databaseDsn,
      }),
    )
    .action(async (opts: Partial<ControlPlaneOptions>) => {
      let running;
      try {
        running = await (await import('../controlplane/server.ts')).startControlPlane(opts);
      } catch (err) {
        if (err instanceof ControlPlaneOptionsError) throw new CliError(err.message);
        throw new CliError(`controlplane failed to start: ${(err as Error).message}`);
      }
      await runUntilSignal(() => running.close());
    });
  addSeedAdminFlag(command, 'the platform administrator role');
  addBooleanFlag(
    command,
    'policy-publish',
    'write the policy snapshot of a co-located enclave into --policy-publish-dir',
    d.policyPublish,
  );
  addBooleanFlag(
    command,
    'config-publish',
    'write the config values of a co-located enclave into --config-publish-dir',
    d.configPublish,
  );
  addMetricsAndEnclaveFlags(command, d, {
    id: 'the enclave this control plane runs beside, on every log line and in /healthz; empty: none',
    name: "that enclave's name, on every log line and in /healthz; empty: none",
  });
  addConnectionFlags(command, d);
  addAuditFlags(command, d, 'a change');
  serve.addCommand(command);
}
