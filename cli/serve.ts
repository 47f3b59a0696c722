import { Command } from 'commander';
import { CliError } from './errors.ts';
import { registerLlmProxy } from './serve-llmproxy.ts';
import { registerControlPlane } from './serve-controlplane.ts';
import { registerBroker } from './serve-broker.ts';
import { registerImds } from './serve-imds.ts';
import { registerGateway } from './serve-gateway.ts';

// `dvx serve <component>`: one component per process (docs/architecture.md).
// Each component registers its own subcommand with its flags as it arrives; asking for one that does
// not exist (yet) is a clear error that lists what there is.

export const COMPONENTS = ['llmproxy', 'gateway', 'controlplane', 'broker', 'relay', 'imds', 'forensics'] as const;

export type ComponentRegistrar = (serve: Command) => void;

/** Components that are built; each adds `dvx serve <name>` with its flags. */
const REGISTRARS: ComponentRegistrar[] = [
  registerLlmProxy,
  registerGateway,
  registerControlPlane,
  registerBroker,
  registerImds,
];

export function serveCommand(): Command {
  const serve = new Command('serve')
    .description('run one server component (TLS-only)')
    .argument('[component]', `one of: ${COMPONENTS.join(', ')}`)
    .allowUnknownOption(false)
    .action((component: string | undefined) => {
      const available = serve.commands.map((c) => c.name());
      const list = available.length > 0 ? available.join(', ') : 'none yet';
      if (component === undefined) throw new CliError(`dvx serve: name a component (available: ${list})`);
      if ((COMPONENTS as readonly string[]).includes(component)) {
        throw new CliError(`dvx serve: component "${component}" is not available in this build (available: ${list})`);
      }
      throw new CliError(
        `dvx serve: unknown component "${component}" (known: ${COMPONENTS.join(', ')}; available: ${list})`,
      );
    });
  for (const register of REGISTRARS) register(serve);
  return serve;
}
