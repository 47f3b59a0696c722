import { Command } from 'commander';
import { fileOrFlags, readJsonBody } from '../operator/json-input.ts';
import { path } from '../operator/operator-client.ts';
import { operatorCommand } from '../operator/operator-command.ts';
import { requireOrg, slug } from '../operator/operator-ids.ts';

// dvx groups list --org ORG | create GROUP --org ORG [--name N] | delete GROUP --org ORG
// An org's groups (spec: groupView, createGroupReq); memberships are "dvx members group-add".

const orgOption = <C extends Command>(c: C): C => c.option('--org <org>', 'the org') as C;

export function groupsCommand(): Command {
  const group = new Command('groups').description("an org's groups");

  group.addCommand(
    orgOption(
      operatorCommand('list', "the org's groups", { routes: ['GET /api/v1/orgs/{org}/groups'] }).operatorAction<{
        org?: string;
      }>(async (ctx, _args, o) => {
        const { body } = await ctx.client.call({ method: 'GET', path: path`/api/v1/orgs/${requireOrg(o.org)}/groups` });
        await ctx.print(body, { columns: ['id', 'name', 'org_id', 'provider_group_ref'] });
      }),
    ),
  );

  group.addCommand(
    orgOption(
      operatorCommand('create', 'create a group in the org', { routes: ['POST /api/v1/orgs/{org}/groups'] })
        .argument('[group]', 'group id (or "id" in --file)')
        .option('--name <name>', 'display name (default: the id)')
        .option('--provider-group-ref <ref>', "the group's id at the identity provider")
        .option('--file <file>', 'the request body as JSON (- for stdin), instead of the flags')
        .operatorAction<{ org?: string; name?: string; providerGroupRef?: string; file?: string }>(
          async (ctx, [id], o) => {
            const org = requireOrg(o.org);
            fileOrFlags(o.file, [
              ...(o.name !== undefined ? ['--name'] : []),
              ...(o.providerGroupRef !== undefined ? ['--provider-group-ref'] : []),
            ]);
            const body: Record<string, unknown> =
              o.file !== undefined
                ? await readJsonBody(o.file)
                : {
                    name: o.name ?? id,
                    ...(o.providerGroupRef !== undefined ? { provider_group_ref: o.providerGroupRef } : {}),
                  };
            if (id !== undefined) body.id = slug(id, 'group');
            else slug(typeof body.id === 'string' ? body.id : undefined, 'group');
            const { body: created } = await ctx.client.call({
              method: 'POST',
              path: path`/api/v1/orgs/${org}/groups`,
              body,
            });
            await ctx.print(created);
          },
        ),
    ),
  );

  group.addCommand(
    orgOption(
      operatorCommand('delete', 'delete a group', { routes: ['DELETE /api/v1/orgs/{org}/groups/{group}'] })
        .argument('<group>', 'group id')
        .operatorAction<{ org?: string }>(async (ctx, [id], o) => {
          const org = requireOrg(o.org);
          await ctx.client.call({ method: 'DELETE', path: path`/api/v1/orgs/${org}/groups/${slug(id, 'group')}` });
          ctx.note(`group ${id} deleted from org ${org}`);
        }),
    ),
  );
  return group;
}
