import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Test } from 'tap';
import type { CpHarness } from '../../fixtures/controlplane-harness.ts';
import { type RunResult, runDvx } from '../../fixtures/run-dvx.ts';

// What the operator command tests share: a token file per persona of a harness's issuer and the CA in a
// temporary directory, and `dvx(persona, args)` running the real bin/dvx with the client options given
// the way a person's shell would (DVX_* variables), so each test names only the command.

export interface OperatorCli {
  dir: string;
  ca: string;
  /** Runs bin/dvx as `persona` against `url` (the control plane unless given), stdout piped (JSON). */
  dvx(
    persona: string,
    args: string[],
    options?: { stdin?: string | Buffer; url?: string; broker?: string; env?: Record<string, string> },
  ): Promise<RunResult>;
  /** The parsed JSON stdout of a run that must succeed. */
  json(persona: string, args: string[], options?: { stdin?: string; url?: string; broker?: string }): Promise<any>;
}

export async function operatorCli(
  t: Test,
  issuer: { token(persona: string): Promise<string> },
  ca: string,
  controlplane: string | null,
): Promise<OperatorCli> {
  const dir = await mkdtemp(join(tmpdir(), 'dvx-cli-op-'));
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  const caFile = join(dir, 'ca.pem');
  await writeFile(caFile, ca);
  const tokens = new Map<string, string>();
  const tokenFile = async (persona: string) => {
    let f = tokens.get(persona);
    if (!f) {
      f = join(dir, `${persona}.token`);
      await writeFile(f, await issuer.token(persona), { mode: 0o600 });
      tokens.set(persona, f);
    }
    return f;
  };
  const cli: OperatorCli = {
    dir,
    ca: caFile,
    async dvx(persona, args, options = {}) {
      const url = options.url ?? controlplane;
      return runDvx(args, {
        stdin: options.stdin,
        env: {
          XDG_CONFIG_HOME: join(dir, 'xdg'),
          DVX_TOKEN_FILE: await tokenFile(persona),
          DVX_CA_CERT: caFile,
          ...(url ? { DVX_CONTROLPLANE: url } : {}),
          ...(options.broker ? { DVX_BROKER: options.broker } : {}),
          ...options.env,
        },
      });
    },
    async json(persona, args, options) {
      const r = await cli.dvx(persona, args, options);
      if (r.code !== 0) throw new Error(`dvx ${args.join(' ')} exited ${r.code}: ${r.stderr}`);
      return JSON.parse(r.stdout);
    },
  };
  return cli;
}

/** The control plane's URL in a harness. */
export const cpUrl = (h: CpHarness, port = h.cp.port) => `https://127.0.0.1:${port}`;
