import { Command } from 'commander';
import { CliError } from '../errors.ts';
import { fileOrFlags, readJsonBody } from '../operator/json-input.ts';
import { path, type Target } from '../operator/operator-client.ts';
import { operatorCommand } from '../operator/operator-command.ts';
import { agentUid, capability, grantId, principal, roleName, slug } from '../operator/operator-ids.ts';

// dvx grant list | create PRINCIPAL (--role R | --capability C) | delete ID
//   no scope flag: platform grants (/api/v1/grants); --org ORG: the org's grants, narrowed with
//   --group G or --agent UID; --local: the enclave broker's own grants (its operator listener's
//   /api/v1/grants, over the caller's org). Spec: grantView, createGrantReq; "Enclave-local grants".

interface Scope {
  org?: string;
  local?: boolean;
}

const scopeFlags = <C extends Command>(c: C): C =>
  c
    .option('--org <org>', "the org's grants (default: platform grants)")
    .option('--local', "the enclave broker's own grants (needs --broker)") as C;

/** Where the grants live: the platform, an org, or the broker. */
function where(o: Scope): { base: string; target: Target } {
  if (o.local && o.org !== undefined)
    throw new CliError("--local and --org are alternatives: the broker grants over the caller's own org");
  if (o.local) return { base: '/api/v1/grants', target: 'broker' };
  if (o.org !== undefined) return { base: path`/api/v1/orgs/${slug(o.org, '--org')}/grants`, target: 'controlplane' };
  return { base: '/api/v1/grants', target: 'controlplane' };
}

const COLUMNS = ['id', 'principal', 'role', 'capability', 'scope_kind', 'org_id', 'group_id', 'agent_id'];

export function grantCommand(): Command {
  const group = new Command('grant').description(
    'grants of roles and capabilities: platform, --org ORG (narrowed by --group/--agent), or --local (the broker)',
  );

  group.addCommand(
    scopeFlags(
      operatorCommand('list', 'the grants at the scope', {
        routes: ['GET /api/v1/grants', 'GET /api/v1/orgs/{org}/grants'],
        brokerRoutes: ['GET /api/v1/grants'],
      }),
    ).operatorAction<Scope>(async (ctx, _a, o) => {
      const { base, target } = where(o);
      const { body } = await ctx.client.call({ method: 'GET', path: base, target });
      await ctx.print(body, { columns: o.local ? COLUMNS.slice(0, 6) : COLUMNS });
    }),
  );

  group.addCommand(
    scopeFlags(
      operatorCommand('create', 'grant a role or a capability to a principal', {
        routes: ['POST /api/v1/grants', 'POST /api/v1/orgs/{org}/grants'],
        brokerRoutes: ['POST /api/v1/grants'],
      }),
    )
      .argument('[principal]', 'user:<subject>, group:<org>:<group> or agent:<uid> (or "principal" in --file)')
      .option('--role <role>', 'the role granted')
      .option('--capability <cap>', 'the capability granted (instead of --role)')
      .option('--group <group>', 'narrow an org grant to one group')
      .option('--agent <uid>', 'narrow an org grant to one agent')
      .option('--file <file>', 'the request body as JSON (- for stdin), instead of the flags')
      .operatorAction<Scope & { role?: string; capability?: string; group?: string; agent?: string; file?: string }>(
        async (ctx, [who], o) => {
          const { base, target } = where(o);
          const flags = (['role', 'capability', 'group', 'agent'] as const).filter((k) => o[k] !== undefined);
          fileOrFlags(
            o.file,
            flags.map((k) => `--${k}`),
          );
          let body: Record<string, unknown>;
          if (o.file !== undefined) body = await readJsonBody(o.file);
          else {
            if ((o.role === undefined) === (o.capability === undefined))
              throw new CliError('exactly one of --role and --capability is required');
            if ((o.group !== undefined || o.agent !== undefined) && (o.org === undefined || o.local))
              throw new CliError('--group and --agent narrow an org grant: give --org ORG');
            if (o.group !== undefined && o.agent !== undefined)
              throw new CliError('--group and --agent are alternatives: a grant is narrowed to one');
            body = {
              ...(o.role !== undefined ? { role: o.local ? o.role : roleName(o.role) } : {}),
              ...(o.capability !== undefined ? { capability: o.local ? o.capability : capability(o.capability) } : {}),
              ...(o.group !== undefined ? { group: slug(o.group, '--group') } : {}),
              ...(o.agent !== undefined ? { agent: agentUid(o.agent, '--agent') } : {}),
            };
          }
          if (who !== undefined) body.principal = principal(who);
          else principal(typeof body.principal === 'string' ? body.principal : undefined);
          const { body: created } = await ctx.client.call({ method: 'POST', path: base, target, body });
          await ctx.print(created);
        },
      ),
  );

  group.addCommand(
    scopeFlags(
      operatorCommand('delete', 'revoke a grant by its id', {
        routes: ['DELETE /api/v1/grants/{id}', 'DELETE /api/v1/orgs/{org}/grants/{id}'],
        brokerRoutes: ['DELETE /api/v1/grants/{id}'],
      }),
    )
      .argument('<id>', 'grant id (dvx grant list)')
      .operatorAction<Scope>(async (ctx, [id], o) => {
        const { base, target } = where(o);
        await ctx.client.call({ method: 'DELETE', path: `${base}${path`/${grantId(id)}`}`, target });
        ctx.note(`grant ${id} revoked`);
      }),
  );
  return group;
}
