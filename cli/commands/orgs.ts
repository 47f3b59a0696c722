import { Command, Option } from 'commander';
import { fileOrFlags, readJsonBody } from '../operator/json-input.ts';
import { path } from '../operator/operator-client.ts';
import { operatorCommand } from '../operator/operator-command.ts';
import { slug } from '../operator/operator-ids.ts';

// dvx orgs list | get ORG | create ORG --name N | set ORG [--name N] [--status S] | delete ORG
// The platform's tenants (spec: orgView, createOrgReq, updateOrgReq). An org's groups are `dvx groups`.

const COLUMNS = ['id', 'name', 'status', 'provider_org_ref'];
const STATUSES = ['active', 'suspended'];

interface OrgFlags {
  name?: string;
  providerOrgRef?: string;
  status?: string;
  file?: string;
}

const bodyFlags = <C extends Command>(c: C): C =>
  c
    .option('--name <name>', 'display name')
    .option('--provider-org-ref <ref>', "the org's id at the identity provider")
    .addOption(new Option('--status <status>', 'active or suspended').choices(STATUSES))
    .option('--file <file>', 'the request body as JSON (- for stdin), instead of the flags') as C;

async function orgBody(o: OrgFlags): Promise<Record<string, unknown>> {
  const given = (['name', 'providerOrgRef', 'status'] as const).filter((k) => o[k] !== undefined);
  fileOrFlags(
    o.file,
    given.map((k) => `--${k.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`)}`),
  );
  if (o.file !== undefined) return readJsonBody(o.file);
  return {
    ...(o.name !== undefined ? { name: o.name } : {}),
    ...(o.providerOrgRef !== undefined ? { provider_org_ref: o.providerOrgRef } : {}),
    ...(o.status !== undefined ? { status: o.status } : {}),
  };
}

export function orgsCommand(): Command {
  const group = new Command('orgs').description('the platform\'s orgs (tenants); their groups are "dvx groups"');

  group.addCommand(
    operatorCommand('list', 'every org', { routes: ['GET /api/v1/orgs'] }).operatorAction(async (ctx) => {
      const { body } = await ctx.client.call({ method: 'GET', path: '/api/v1/orgs' });
      await ctx.print(body, { columns: COLUMNS });
    }),
  );

  group.addCommand(
    operatorCommand('get', 'one org', { routes: ['GET /api/v1/orgs/{org}'] })
      .argument('<org>', 'org id')
      .operatorAction(async (ctx, [org]) => {
        const { body } = await ctx.client.call({ method: 'GET', path: path`/api/v1/orgs/${slug(org, 'org')}` });
        await ctx.print(body);
      }),
  );

  group.addCommand(
    bodyFlags(
      operatorCommand('create', 'create an org (--name, or the body in --file)', { routes: ['POST /api/v1/orgs'] })
        .argument('[org]', 'org id (or "id" in --file)')
        .operatorAction<OrgFlags>(async (ctx, [org], o) => {
          const body = await orgBody(o);
          if (org !== undefined) body.id = slug(org, 'org');
          else slug(typeof body.id === 'string' ? body.id : undefined, 'org');
          if (o.file === undefined && o.name === undefined) body.name = org;
          const { body: created } = await ctx.client.call({ method: 'POST', path: '/api/v1/orgs', body });
          await ctx.print(created);
        }),
    ),
  );

  group.addCommand(
    bodyFlags(
      operatorCommand('set', "change an org's name, provider reference or status", {
        routes: ['PUT /api/v1/orgs/{org}'],
      })
        .argument('<org>', 'org id')
        .operatorAction<OrgFlags>(async (ctx, [org], o) => {
          const body = await orgBody(o);
          const { body: updated } = await ctx.client.call({
            method: 'PUT',
            path: path`/api/v1/orgs/${slug(org, 'org')}`,
            body,
          });
          await ctx.print(updated);
        }),
    ),
  );

  group.addCommand(
    operatorCommand('delete', 'delete an org (its data stays until "dvx erasure create")', {
      routes: ['DELETE /api/v1/orgs/{org}'],
    })
      .argument('<org>', 'org id')
      .operatorAction(async (ctx, [org]) => {
        await ctx.client.call({ method: 'DELETE', path: path`/api/v1/orgs/${slug(org, 'org')}` });
        ctx.note(`org ${org} deleted`);
      }),
  );
  return group;
}
