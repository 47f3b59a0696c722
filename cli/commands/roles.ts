import { Command } from 'commander';
import { CliError } from '../errors.ts';
import { EXIT_NOT_FOUND } from '../exit-codes.ts';
import { fileOrFlags, readJsonBody } from '../operator/json-input.ts';
import { path } from '../operator/operator-client.ts';
import { operatorCommand } from '../operator/operator-command.ts';
import { capability, collect, roleName } from '../operator/operator-ids.ts';

// dvx roles list | get NAME | create NAME --capability C… | set NAME --capability C… | delete NAME
// The built-in roles and the platform's custom ones (spec: roleView, createRoleReq, putRoleReq).
// There is no route for one role: `get` reads the list and picks it.

interface RoleFlags {
  capability?: string[];
  file?: string;
}

const bodyFlags = <C extends Command>(c: C): C =>
  c
    .option('--capability <cap>', 'a capability the role confers (repeat for more)', collect)
    .option('--file <file>', 'the request body as JSON (- for stdin), instead of the flags') as C;

async function capabilitiesBody(o: RoleFlags): Promise<Record<string, unknown>> {
  fileOrFlags(o.file, o.capability ? ['--capability'] : []);
  if (o.file !== undefined) return readJsonBody(o.file);
  if (!o.capability?.length) throw new CliError('--capability CAP is required (repeat it for more), or --file');
  return { capabilities: o.capability.map(capability) };
}

export function rolesCommand(): Command {
  const group = new Command('roles').description('roles: named sets of capabilities (built-in and custom)');

  group.addCommand(
    operatorCommand('list', 'every role and its capabilities', { routes: ['GET /api/v1/roles'] }).operatorAction(
      async (ctx) => {
        const { body } = await ctx.client.call({ method: 'GET', path: '/api/v1/roles' });
        await ctx.print(body, { columns: ['name', 'capabilities'] });
      },
    ),
  );

  group.addCommand(
    operatorCommand('get', 'one role', { routes: ['GET /api/v1/roles'] })
      .argument('<name>', 'role name')
      .operatorAction(async (ctx, [name]) => {
        const { body } = await ctx.client.call<{ name: string }[]>({ method: 'GET', path: '/api/v1/roles' });
        const found = Array.isArray(body) ? body.find((r) => r.name === name) : undefined;
        if (!found) throw new CliError(`no role ${name}`, EXIT_NOT_FOUND);
        await ctx.print(found);
      }),
  );

  group.addCommand(
    bodyFlags(
      operatorCommand('create', 'create a custom role', { routes: ['POST /api/v1/roles'] })
        .argument('[name]', 'role name (or "name" in --file)')
        .operatorAction<RoleFlags>(async (ctx, [name], o) => {
          const body = await capabilitiesBody(o);
          if (name !== undefined) body.name = roleName(name);
          const { body: created } = await ctx.client.call({ method: 'POST', path: '/api/v1/roles', body });
          await ctx.print(created);
        }),
    ),
  );

  group.addCommand(
    bodyFlags(
      operatorCommand('set', "replace a custom role's capabilities", { routes: ['PUT /api/v1/roles/{name}'] })
        .argument('<name>', 'role name')
        .operatorAction<RoleFlags>(async (ctx, [name], o) => {
          const body = await capabilitiesBody(o);
          const { body: updated } = await ctx.client.call({
            method: 'PUT',
            path: path`/api/v1/roles/${roleName(name)}`,
            body,
          });
          await ctx.print(updated);
        }),
    ),
  );

  group.addCommand(
    operatorCommand('delete', 'delete a custom role', { routes: ['DELETE /api/v1/roles/{name}'] })
      .argument('<name>', 'role name')
      .operatorAction(async (ctx, [name]) => {
        await ctx.client.call({ method: 'DELETE', path: path`/api/v1/roles/${roleName(name)}` });
        ctx.note(`role ${name} deleted`);
      }),
  );
  return group;
}
