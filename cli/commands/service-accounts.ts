import { Command } from 'commander';
import { CliError } from '../errors.ts';
import { fileOrFlags, readJsonBody } from '../operator/json-input.ts';
import { path } from '../operator/operator-client.ts';
import { type ActionContext, operatorCommand } from '../operator/operator-command.ts';
import { agentUid, capability, collect, grantId, requireOrg, roleName, slug } from '../operator/operator-ids.ts';
import { SecretFileOut } from '../operator/secret-file-out.ts';

// dvx service-accounts list | get ID | create NAME --key-out F | self-service NAME --key-out F |
//   transfer ID --owner SUBJECT | disable ID | keys create ID --key-out F | keys delete ID KEY |
//   grants list ID | grants create ID (--role R | --capability C) | grants delete ID GRANT   (all --org ORG)
// Spec: "Service accounts". The key the control plane returns once (a private JWK in a key file) is
// written to --key-out FILE (0600, never over an existing file) and left out of what is printed.

const withOrg = <C extends Command>(c: C): C => c.option('--org <org>', "the service account's org") as C;
const keyOut = <C extends Command>(c: C): C =>
  c.option('--key-out <file>', 'write the returned key here (mode 0600, new file)') as C;
const COLUMNS = ['id', 'owner', 'level', 'status', 'org_id', 'created_at'];

/** Sends a call that returns a credential, writes it to the key file, prints the rest. */
async function withKey(
  ctx: ActionContext,
  file: string | undefined,
  call: () => Promise<Record<string, unknown>>,
): Promise<void> {
  const out = await SecretFileOut.create(file);
  const answer = await out.around(call, (a) => a.credential);
  const { credential: _secret, ...rest } = answer;
  await ctx.print(rest);
  ctx.note(`the key is in ${out.path} (mode 0600); it is not shown again`);
}

const accountId = (id: string | undefined) => {
  if (!id || /[/\s]/.test(id)) throw new CliError(`service account id ${JSON.stringify(id ?? '')} is not valid`);
  return id;
};

export function serviceAccountsCommand(): Command {
  const group = new Command('service-accounts').description(
    "an org's service accounts: machine identities at the IdP, their keys and grants",
  );

  group.addCommand(
    withOrg(
      operatorCommand('list', "the org's service accounts", {
        routes: ['GET /api/v1/orgs/{org}/service-accounts'],
      }),
    ).operatorAction<{ org?: string }>(async (ctx, _a, o) => {
      const org = requireOrg(o.org);
      const { body } = await ctx.client.call({ method: 'GET', path: path`/api/v1/orgs/${org}/service-accounts` });
      await ctx.print(body, { columns: COLUMNS });
    }),
  );

  group.addCommand(
    withOrg(operatorCommand('get', 'one service account', { routes: ['GET /api/v1/orgs/{org}/service-accounts/{id}'] }))
      .argument('<id>', 'service account id')
      .operatorAction<{ org?: string }>(async (ctx, [id], o) => {
        const org = requireOrg(o.org);
        const { body } = await ctx.client.call({
          method: 'GET',
          path: path`/api/v1/orgs/${org}/service-accounts/${accountId(id)}`,
        });
        await ctx.print(body);
      }),
  );

  group.addCommand(
    keyOut(
      withOrg(
        operatorCommand('create', 'create an org-level service account; its key goes to --key-out', {
          routes: ['POST /api/v1/orgs/{org}/service-accounts'],
        }),
      ),
    )
      .argument('<name>', 'the account name')
      .operatorAction<{ org?: string; keyOut?: string }>(async (ctx, [name], o) => {
        const org = requireOrg(o.org);
        if (!name.trim()) throw new CliError('the name must not be empty');
        await withKey(ctx, o.keyOut, async () => {
          const { body } = await ctx.client.call<Record<string, unknown>>({
            method: 'POST',
            path: path`/api/v1/orgs/${org}/service-accounts`,
            body: { name },
          });
          return body;
        });
      }),
  );

  group.addCommand(
    keyOut(
      withOrg(
        operatorCommand('self-service', 'create a service account you own, with your groups and grants (never more)', {
          routes: ['POST /api/v1/orgs/{org}/service-accounts/self-service'],
        }),
      ),
    )
      .argument('[name]', 'the account name (or "name" in --file)')
      .option('--group <group>', 'a group of yours the account joins (repeat for more)', collect)
      .option(
        '--capability <cap>',
        'an org-wide capability of yours it gets (repeat); narrower ones via --file',
        collect,
      )
      .option('--file <file>', 'the request body (createSelfServiceSAReq) as JSON (- for stdin)')
      .operatorAction<{ org?: string; keyOut?: string; group?: string[]; capability?: string[]; file?: string }>(
        async (ctx, [name], o) => {
          const org = requireOrg(o.org);
          fileOrFlags(o.file, [...(o.group ? ['--group'] : []), ...(o.capability ? ['--capability'] : [])]);
          const body: Record<string, unknown> =
            o.file !== undefined
              ? await readJsonBody(o.file)
              : {
                  ...(o.group ? { groups: o.group.map((g) => slug(g, '--group')) } : {}),
                  ...(o.capability ? { grants: o.capability.map((c) => ({ capability: capability(c) })) } : {}),
                };
          if (name !== undefined) body.name = name;
          if (typeof body.name !== 'string' || !body.name.trim()) throw new CliError('a name is required');
          await withKey(ctx, o.keyOut, async () => {
            const { body: answer } = await ctx.client.call<Record<string, unknown>>({
              method: 'POST',
              path: path`/api/v1/orgs/${org}/service-accounts/self-service`,
              body,
            });
            return answer;
          });
        },
      ),
  );

  group.addCommand(
    withOrg(
      operatorCommand('transfer', 'give a service account to another owner', {
        routes: ['POST /api/v1/orgs/{org}/service-accounts/{id}/transfer'],
      }),
    )
      .argument('<id>', 'service account id')
      .option('--owner <subject>', 'the new owner')
      .operatorAction<{ org?: string; owner?: string }>(async (ctx, [id], o) => {
        const org = requireOrg(o.org);
        if (!o.owner) throw new CliError('--owner SUBJECT is required');
        const { body } = await ctx.client.call({
          method: 'POST',
          path: path`/api/v1/orgs/${org}/service-accounts/${accountId(id)}/transfer`,
          body: { owner: o.owner },
        });
        await ctx.print(body);
      }),
  );

  group.addCommand(
    withOrg(
      operatorCommand('disable', 'disable a service account (its tokens are refused from now on)', {
        routes: ['POST /api/v1/orgs/{org}/service-accounts/{id}/disable'],
      }),
    )
      .argument('<id>', 'service account id')
      .operatorAction<{ org?: string }>(async (ctx, [id], o) => {
        const org = requireOrg(o.org);
        const { body } = await ctx.client.call({
          method: 'POST',
          path: path`/api/v1/orgs/${org}/service-accounts/${accountId(id)}/disable`,
        });
        await ctx.print(body);
      }),
  );

  const keys = new Command('keys').description("a service account's keys");
  keys.addCommand(
    keyOut(
      withOrg(
        operatorCommand('create', 'add a key to a service account; it goes to --key-out', {
          routes: ['POST /api/v1/orgs/{org}/service-accounts/{id}/keys'],
        }),
      ),
    )
      .argument('<id>', 'service account id')
      .operatorAction<{ org?: string; keyOut?: string }>(async (ctx, [id], o) => {
        const org = requireOrg(o.org);
        const account = accountId(id);
        await withKey(ctx, o.keyOut, async () => {
          const { body } = await ctx.client.call<Record<string, unknown>>({
            method: 'POST',
            path: path`/api/v1/orgs/${org}/service-accounts/${account}/keys`,
          });
          return body;
        });
      }),
  );
  keys.addCommand(
    withOrg(
      operatorCommand('delete', 'remove a key from a service account', {
        routes: ['DELETE /api/v1/orgs/{org}/service-accounts/{id}/keys/{key}'],
      }),
    )
      .argument('<id>', 'service account id')
      .argument('<key>', 'key id (its kid)')
      .operatorAction<{ org?: string }>(async (ctx, [id, key], o) => {
        const org = requireOrg(o.org);
        await ctx.client.call({
          method: 'DELETE',
          path: path`/api/v1/orgs/${org}/service-accounts/${accountId(id)}/keys/${key}`,
        });
        ctx.note(`key ${key} of service account ${id} deleted`);
      }),
  );
  group.addCommand(keys);

  const grants = new Command('grants').description("a service account's grants, within its org");
  grants.addCommand(
    withOrg(
      operatorCommand('list', "the account's grants", {
        routes: ['GET /api/v1/orgs/{org}/service-accounts/{id}/grants'],
      }),
    )
      .argument('<id>', 'service account id')
      .operatorAction<{ org?: string }>(async (ctx, [id], o) => {
        const org = requireOrg(o.org);
        const { body } = await ctx.client.call({
          method: 'GET',
          path: path`/api/v1/orgs/${org}/service-accounts/${accountId(id)}/grants`,
        });
        await ctx.print(body, {
          columns: ['id', 'role', 'capability', 'scope_kind', 'org_id', 'group_id', 'agent_id'],
        });
      }),
  );
  grants.addCommand(
    withOrg(
      operatorCommand('create', 'grant the account a role or capability, org-wide or narrowed', {
        routes: ['POST /api/v1/orgs/{org}/service-accounts/{id}/grants'],
      }),
    )
      .argument('<id>', 'service account id')
      .option('--role <role>', 'the role granted')
      .option('--capability <cap>', 'the capability granted (instead of --role)')
      .option('--group <group>', 'narrow to one group')
      .option('--agent <uid>', 'narrow to one agent')
      .operatorAction<{ org?: string; role?: string; capability?: string; group?: string; agent?: string }>(
        async (ctx, [id], o) => {
          const org = requireOrg(o.org);
          if ((o.role === undefined) === (o.capability === undefined))
            throw new CliError('exactly one of --role and --capability is required');
          if (o.group !== undefined && o.agent !== undefined)
            throw new CliError('--group and --agent are alternatives: a grant is narrowed to one');
          const body = {
            ...(o.role !== undefined ? { role: roleName(o.role) } : {}),
            ...(o.capability !== undefined ? { capability: capability(o.capability) } : {}),
            ...(o.group !== undefined ? { group: slug(o.group, '--group') } : {}),
            ...(o.agent !== undefined ? { agent: agentUid(o.agent, '--agent') } : {}),
          };
          const { body: created } = await ctx.client.call({
            method: 'POST',
            path: path`/api/v1/orgs/${org}/service-accounts/${accountId(id)}/grants`,
            body,
          });
          await ctx.print(created);
        },
      ),
  );
  grants.addCommand(
    withOrg(
      operatorCommand('delete', "revoke one of the account's grants", {
        routes: ['DELETE /api/v1/orgs/{org}/service-accounts/{id}/grants/{grant}'],
      }),
    )
      .argument('<id>', 'service account id')
      .argument('<grant>', 'grant id')
      .operatorAction<{ org?: string }>(async (ctx, [id, grant], o) => {
        const org = requireOrg(o.org);
        await ctx.client.call({
          method: 'DELETE',
          path: path`/api/v1/orgs/${org}/service-accounts/${accountId(id)}/grants/${grantId(grant)}`,
        });
        ctx.note(`grant ${grant} of service account ${id} revoked`);
      }),
  );
  group.addCommand(grants);
  return group;
}
