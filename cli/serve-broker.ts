import type { Command } from 'commander';
import { Command as Cmd } from 'commander';
import { flag, parseDurationFlag } from '../core/options.ts';
import { runUntilSignal } from '../core/shutdown.ts';
import { BrokerOptionsError } from '../enclave/errors.ts';
import { BROKER_DEFAULTS, type BrokerOptions } from '../enclave/broker/options.ts';
import { CliError } from './errors.ts';
import { readBrokerToken } from './pull.ts';
import {
  addAuditFlags,
  addCommonFlags,
  addConnectionFlags,
  addMetricsAndEnclaveFlags,
  addSeedAdminFlag,
} from './server-flags.ts';

// `dvx serve broker`: the enclave's control node (spec: Server components, broker row; docs/enclave.md).
export function registerBroker(serve: Command): void {
  const d = BROKER_DEFAULTS;
  const command = addCommonFlags(
    new Cmd('broker').description(
      'enclave control node: agent identity and lifecycle, secrets, the enclave audit, convergence on the control plane',
    ),
    d,
  )
    .addOption(
      flag('--operator-addr <addr>', {
        description: 'operator listener (secrets, grants, audit)',
        default: d.operatorAddr,
      }),
    )
    .addOption(
      flag('--controlplane <url>', {
        description: "the control plane's base URL; empty: the enclave runs on its own store",
        default: d.controlplane,
      }),
    )
    .addOption(
      flag('--broker-key <file>', {
        description: 'the key POST /api/v1/enclaves returned (registerBrokerView.key, or the bare token)',
        default: d.brokerKey,
      }),
    )
    .addOption(
      flag('--ca-cert <file>', {
        description: 'CA bundle trusted for the control plane and the local issuer',
        default: d.caCert,
      }),
    )
    .addOption(
      flag('--local-issuer <url>', {
        description: "OIDC issuer of this enclave's operators; empty: no operator listener API",
        default: d.localIssuer,
      }),
    )
    .addOption(
      flag('--local-audience <aud>', {
        description: 'audience operator tokens must carry; empty: not checked',
        default: d.localAudience,
      }),
    )
    .addOption(
      flag('--org-claim <claim>', {
        description: "claim holding an operator's org (dotted path)",
        default: d.orgClaim,
      }),
    )
    .addOption(flag('--owning-org <org>', { description: 'the org that owns this enclave', default: d.owningOrg }))
    .addOption(
      flag('--pull-interval <duration>', {
        description: 'pull the desired state this often (besides every event)',
        default: d.pullInterval,
        parse: parseDurationFlag,
      }),
    )
    .addOption(
      flag('--state-dir <dir>', {
        description: 'where the broker keeps its state (database, KMS key, enclave CA, satellite token)',
        default: d.stateDir,
      }),
    )
    .addOption(
      flag('--database-dsn <dsn>', {
        description: 'postgres://… or pglite://DIR; empty: PGlite under --state-dir',
        default: d.databaseDsn,
      }),
    )
    .addOption(
      flag('--agent-host-dir <dir>', {
        description: 'where bootstrap tokens are written (DIR/<uid>/bootstrap-token); empty: <state-dir>/agents',
        default: d.agentHostDir,
      }),
    )
    .addOption(
      flag('--enclave-ca-cert <file>', {
        description: 'the enclave CA certificate (agent identity certificates); generated when absent',
        default: d.enclaveCaCert,
      }),
    )
    .addOption(
      flag('--enclave-ca-key <file>', { description: "the enclave CA's private key", default: d.enclaveCaKey }),
    )
    .addOption(
      flag('--kms-config <file>', {
        description: 'local KMS master key (created 0600 if absent); empty: <state-dir>/kms-key.json',
        default: d.kmsConfig,
      }),
    )
    .addOption(
      flag('--satellite-token-file <file>', {
        description: "the satellites' bearer token (created 0600 if absent); empty: <state-dir>/satellite-token",
        default: d.satelliteTokenFile,
      }),
    )
    .addOption(
      flag('--snapshot-out <file>', {
        description: 'also write the policy snapshot here for co-located satellites (as dvx policy-pull)',
        default: d.snapshotOut,
      }),
    )
    .addOption(
      flag('--config-out <file>', {
        description: 'also write the config values here (as dvx config-pull)',
        default: d.configOut,
      }),
    )
    .addOption(
      flag('--public-url <url>', {
        description: "the agent listener's public https URL (the JWT's iss); empty: https://<addr>",
        default: d.publicUrl,
      }),
    )
    .addOption(
      flag('--key-rotation <duration>', {
        description: 'signing-key rotation period',
        default: d.keyRotation,
        parse: parseDurationFlag,
      }),
    )
    .addOption(
      flag('--bootstrap-ttl <duration>', {
        description: 'lifetime of an unused bootstrap token',
        default: d.bootstrapTtl,
        parse: parseDurationFlag,
      }),
    )
    .addOption(
      flag('--refresh-ttl <duration>', {
        description: 'lifetime of an unused refresh token',
        default: d.refreshTtl,
        parse: parseDurationFlag,
      }),
    )
    .action(async (opts: Partial<BrokerOptions>) => {
      let running;
      try {
        const brokerKey = opts.brokerKey ? await readBrokerToken(opts.brokerKey) : '';
        running = await (await import('../enclave/broker/server.ts')).startBroker({ ...opts, brokerKey });
      } catch (err) {
        if (err instanceof BrokerOptionsError || err instanceof CliError) throw new CliError(err.message);
        throw new CliError(`broker failed to start: ${(err as Error).message}`);
      }
      await runUntilSignal(() => running.close());
    });
  addSeedAdminFlag(command, 'the admin grant over --owning-org in this enclave');
  addMetricsAndEnclaveFlags(command, d, {
    id: 'the registered enclave this broker runs (required with --controlplane)',
    name: "the enclave's name, on every log line, audit record and /healthz",
  });
  addConnectionFlags(command, d);
  addAuditFlags(command, d, 'a lifecycle change, a secret write or an exchange');
  serve.addCommand(command);
}
