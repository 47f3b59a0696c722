import { once } from 'node:events';
import { Command } from 'commander';
import { addClientOptions, type ClientSettings, resolveClientSettings } from './client-options.ts';
import { OperatorClient } from './operator-client.ts';
import { type RenderOptions, printable, render } from './output.ts';

// The one way an operator command is built: its arguments and own options, the client options, the
// routes it wraps (which is how test/cli/operator/openapi-agreement.test.ts proves every route of the
// control plane has a command), and an action that gets a ready client and prints through `ctx`.
//
//   operatorCommand('get', 'show one org', { routes: ['GET /api/v1/orgs/{org}'] })
//     .argument('<org>')
//     .action(async (ctx, [org]) => ctx.print((await ctx.client.call({ method: 'GET', path: path`/api/v1/orgs/${org}` })).body));

export interface ActionContext {
  client: OperatorClient;
  settings: ClientSettings;
  /** stdout is a terminal (tables, progress); false when piped. */
  isTty: boolean;
  /** Aborted on SIGINT/SIGTERM: long waits and followed streams end cleanly on it. */
  signal: AbortSignal;
  /** Prints data in the chosen format (table, json, jsonl); waits when the reader is slow. */
  print(data: unknown, options?: RenderOptions): Promise<void>;
  /** A line for the person (progress, "deleted"), on stderr so stdout stays parseable. */
  note(text: string): void;
}

export interface RouteDeclaration {
  /** Control-plane routes, as `METHOD /api/v1/path/{param}` (the OpenAPI document's templates). */
  routes?: readonly string[];
  /** Routes of the enclave broker's operator listener; adds --broker to the command. */
  brokerRoutes?: readonly string[];
}

const declared = new WeakMap<Command, RouteDeclaration>();

/** Every route the commands under `root` declare: `METHOD /path` for the control plane, `broker METHOD /path` for the broker. */
export function declaredRoutes(root: Command): Set<string> {
  const out = new Set<string>();
  const walk = (c: Command) => {
    const d = declared.get(c);
    for (const r of d?.routes ?? []) out.add(r);
    for (const r of d?.brokerRoutes ?? []) out.add(`broker ${r}`);
    for (const sub of c.commands) walk(sub);
  };
  walk(root);
  return out;
}

type OperatorAction<O> = (ctx: ActionContext, args: string[], options: O) => Promise<void>;

export interface OperatorCommand extends Command {
  /** Sets the action: the context first, then the positional arguments, then the command's own options. */
  operatorAction<O = Record<string, unknown>>(fn: OperatorAction<O>): this;
}

export function operatorCommand(name: string, description: string, routes: RouteDeclaration): OperatorCommand {
  const command = new Command(name).description(description) as OperatorCommand;
  addClientOptions(command, { broker: (routes.brokerRoutes?.length ?? 0) > 0 });
  declared.set(command, routes);
  command.operatorAction = function <O>(fn: OperatorAction<O>) {
    this.action(async (...raw: unknown[]) => {
      const self = raw[raw.length - 1] as Command;
      const options = raw[raw.length - 2] as O;
      const args = raw.slice(0, -2).flatMap((a) => (Array.isArray(a) ? a : a === undefined ? [] : [a])) as string[];
      await runOperatorAction(self, args, options, fn);
    });
    return this;
  };
  return command;
}

async function runOperatorAction<O>(self: Command, args: string[], options: O, fn: OperatorAction<O>): Promise<void> {
  const isTty = !!process.stdout.isTTY;
  const settings = await resolveClientSettings(self, isTty);
  const client = new OperatorClient(settings);
  const abort = new AbortController();
  const stop = () => abort.abort();
  process.once('SIGINT', stop);
  process.once('SIGTERM', stop);
  // A reader that went away (`dvx audit tail | head -1`) ends the command quietly, like any Unix filter.
  const onStdoutError = (err: NodeJS.ErrnoException) => {
    if (err.code === 'EPIPE') abort.abort();
  };
  process.stdout.on('error', onStdoutError);
  const ctx: ActionContext = {
    client,
    settings,
    isTty,
    signal: abort.signal,
    async print(data, renderOptions) {
      const text = render(data, settings.output, renderOptions);
      if (!text || abort.signal.aborted) return;
      if (!process.stdout.write(text))
        await Promise.race([once(process.stdout, 'drain'), once(abort.signal, 'abort')]).catch(() => {});
    },
    note(text) {
      process.stderr.write(`${printable(text)}\n`);
    },
  };
  try {
    await fn(ctx, args, options);
  } finally {
    process.off('SIGINT', stop);
    process.off('SIGTERM', stop);
    process.stdout.off('error', onStdoutError);
    await client.close();
  }
}
