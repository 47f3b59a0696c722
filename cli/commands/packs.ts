import { Command } from 'commander';
import { PolicyValidationError } from '../../pipeline/errors.ts';
import { validateRules } from '../../pipeline/policy/governance.ts';
import { validatePacks } from '../../pipeline/policy/snapshot.ts';
import { CliError } from '../errors.ts';
import { EXIT_NOT_FOUND } from '../exit-codes.ts';
import { readJsonInput } from '../operator/json-input.ts';
import { operatorCommand } from '../operator/operator-command.ts';
import { path } from '../operator/operator-client.ts';
import { addScopeOptions, type ScopeFlags, scopeLabel, scopeQuery } from '../operator/scope-flags.ts';

// dvx packs: destination policy packs (operator-api.md: definePackReq → definePackView, installPackView):
// defined once on the platform (allow and deny rules, and LLM policy the pack adds), installed at a scope.
// A definition is checked here by the same validators the control plane uses before it is sent.

/** The control plane's pack name form (governance.ts). */
const PACK = /^[a-z0-9][a-z0-9_.-]{0,62}$/;

function checkedName(name: string): string {
  if (!PACK.test(name))
    throw new CliError(`pack name "${name}" must be 1–63 lowercase letters, digits, ".", "-" or "_"`);
  return name;
}

/** The definition's body, validated like the server's (allow, deny: Rule lists; config: the pack's LLM policy). */
export function validatePackDefinition(name: string, doc: unknown): Record<string, unknown> {
  if (!doc || typeof doc !== 'object' || Array.isArray(doc))
    throw new CliError('--file must hold a JSON object: {allow?, deny?, config?}');
  const body = { ...(doc as Record<string, unknown>) };
  for (const k of Object.keys(body))
    if (!['name', 'allow', 'deny', 'config'].includes(k))
      throw new CliError(`invalid pack: ${k}: unknown field (allowed: allow, deny, config)`);
  if (body.name !== undefined && body.name !== name)
    throw new CliError(`the file names pack "${String(body.name)}", the command "${name}"`);
  try {
    validateRules(body.allow, 'allow');
    validateRules(body.deny, 'deny');
    if (body.config !== undefined) validatePacks([{ name, config: body.config }], 'pack');
  } catch (err) {
    if (err instanceof PolicyValidationError)
      throw new CliError(`invalid pack: ${err.message.replace(/^pack\[0\]\./, '')}`);
    throw err;
  }
  return { ...body, name };
}

export function packsCommand(): Command {
  const packs = new Command('packs').description(
    'destination policy packs: define on the platform, install at a scope',
  );
  const columns = ['name', 'allow', 'deny', 'config'];

  packs.addCommand(
    operatorCommand('list', 'every pack defined', { routes: ['GET /api/v1/packs'] }).operatorAction(async (ctx) => {
      const { body } = await ctx.client.call({ method: 'GET', path: '/api/v1/packs' });
      await ctx.print(body, { columns });
    }),
  );
  packs.addCommand(
    operatorCommand('get', 'one pack', { routes: ['GET /api/v1/packs'] })
      .argument('<name>')
      .operatorAction(async (ctx, [name]) => {
        checkedName(name);
        const { body } = await ctx.client.call<{ name: string }[]>({ method: 'GET', path: '/api/v1/packs' });
        const pack = body.find((p) => p.name === name);
        if (!pack) throw new CliError(`no pack ${name}`, EXIT_NOT_FOUND);
        await ctx.print(pack);
      }),
  );
  packs.addCommand(
    operatorCommand('create', 'define (or redefine) a pack from --file {allow?, deny?, config?}', {
      routes: ['POST /api/v1/packs'],
    })
      .alias('set')
      .argument('<name>')
      .requiredOption('--file <file>', 'the definition as JSON (- for stdin)')
      .operatorAction<{ file: string }>(async (ctx, [name], o) => {
        checkedName(name);
        const body = validatePackDefinition(name, await readJsonInput(o.file));
        const answer = await ctx.client.call({ method: 'POST', path: '/api/v1/packs', body });
        await ctx.print(answer.body);
      }),
  );
  packs.addCommand(
    addScopeOptions(
      operatorCommand('install', 'install a pack at a scope (platform when no scope is given)', {
        routes: ['PUT /api/v1/packs/{name}/installations'],
      }).argument('<name>'),
    ).operatorAction<ScopeFlags>(async (ctx, [name], o) => {
      checkedName(name);
      const { body } = await ctx.client.call({
        method: 'PUT',
        path: path`/api/v1/packs/${name}/installations`,
        query: scopeQuery(o),
      });
      await ctx.print(body);
    }),
  );
  packs.addCommand(
    addScopeOptions(
      operatorCommand('uninstall', 'remove a pack from a scope', {
        routes: ['DELETE /api/v1/packs/{name}/installations'],
      }).argument('<name>'),
    ).operatorAction<ScopeFlags>(async (ctx, [name], o) => {
      checkedName(name);
      const query = scopeQuery(o);
      await ctx.client.call({ method: 'DELETE', path: path`/api/v1/packs/${name}/installations`, query });
      ctx.note(`uninstalled ${name} at ${scopeLabel(query)}`);
    }),
  );
  return packs;
}
