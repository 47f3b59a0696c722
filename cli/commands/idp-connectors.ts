import { Command, Option } from 'commander';
import { CliError } from '../errors.ts';
import { fileOrFlags, readJsonBody, readTextArg } from '../operator/json-input.ts';
import { path } from '../operator/operator-client.ts';
import { operatorCommand } from '../operator/operator-command.ts';
import { collect, requireOrg, slug } from '../operator/operator-ids.ts';

// dvx idp-connectors list | get NAME | set NAME --type oidc|saml … | delete NAME   (all --org ORG)
// An org's identity-provider connectors (spec: idpConnectorReq, idpConnectorView). The client secret is
// write-only and never read from argv: --client-secret-file F (- for stdin); a set without it keeps
// the stored one.

const withOrg = <C extends Command>(c: C): C => c.option('--org <org>', 'the org') as C;

interface SetFlags {
  org?: string;
  type?: string;
  oidcIssuer?: string;
  metadataUrl?: string;
  clientId?: string;
  clientSecretFile?: string;
  groupsAttribute?: string;
  scope?: string[];
  file?: string;
}

export function idpConnectorsCommand(): Command {
  const group = new Command('idp-connectors').description("an org's identity-provider connectors (OIDC, SAML)");

  group.addCommand(
    withOrg(
      operatorCommand('list', "the org's connectors", { routes: ['GET /api/v1/orgs/{org}/idp-connectors'] }),
    ).operatorAction<{ org?: string }>(async (ctx, _a, o) => {
      const { body } = await ctx.client.call({
        method: 'GET',
        path: path`/api/v1/orgs/${requireOrg(o.org)}/idp-connectors`,
      });
      await ctx.print(body, { columns: ['name', 'type', 'status', 'groups_attribute', 'org_id'] });
    }),
  );

  group.addCommand(
    withOrg(operatorCommand('get', 'one connector', { routes: ['GET /api/v1/orgs/{org}/idp-connectors/{name}'] }))
      .argument('<name>', 'connector name')
      .operatorAction<{ org?: string }>(async (ctx, [name], o) => {
        const { body } = await ctx.client.call({
          method: 'GET',
          path: path`/api/v1/orgs/${requireOrg(o.org)}/idp-connectors/${slug(name, 'connector name')}`,
        });
        await ctx.print(body);
      }),
  );

  group.addCommand(
    withOrg(
      operatorCommand('set', 'create or replace a connector', {
        routes: ['PUT /api/v1/orgs/{org}/idp-connectors/{name}'],
      }),
    )
      .argument('<name>', 'connector name')
      .addOption(new Option('--type <type>', 'oidc or saml').choices(['oidc', 'saml']))
      .option('--oidc-issuer <url>', "the connector's OIDC issuer (type oidc)")
      .option('--metadata-url <url>', 'SAML metadata URL (type saml)')
      .option('--client-id <id>', 'OIDC client id (type oidc)')
      .option('--client-secret-file <file>', 'a file holding the OIDC client secret (- for stdin)')
      .option('--groups-attribute <claim>', 'the claim or attribute that carries group names')
      .option('--scope <scope>', 'an OIDC scope to request (repeat for more)', collect)
      .option('--file <file>', 'the request body (idpConnectorReq) as JSON (- for stdin), instead of the flags')
      .operatorAction<SetFlags>(async (ctx, [name], o) => {
        const org = requireOrg(o.org);
        const connector = slug(name, 'connector name');
        const flagNames: [keyof SetFlags, string][] = [
          ['type', '--type'],
          ['oidcIssuer', '--oidc-issuer'],
          ['metadataUrl', '--metadata-url'],
          ['clientId', '--client-id'],
          ['clientSecretFile', '--client-secret-file'],
          ['groupsAttribute', '--groups-attribute'],
          ['scope', '--scope'],
        ];
        fileOrFlags(
          o.file,
          flagNames.filter(([k]) => o[k] !== undefined).map(([, f]) => f),
        );
        let body: Record<string, unknown>;
        if (o.file !== undefined) body = await readJsonBody(o.file);
        else {
          if (!o.type) throw new CliError('--type oidc|saml is required (or --file)');
          if (o.type === 'oidc' && (!o.oidcIssuer || !o.clientId))
            throw new CliError('an oidc connector needs --oidc-issuer and --client-id');
          if (o.type === 'saml' && !o.metadataUrl) throw new CliError('a saml connector needs --metadata-url');
          let secret: string | undefined;
          if (o.clientSecretFile !== undefined) {
            secret = (await readTextArg(o.clientSecretFile, '--client-secret-file')).replace(/\r?\n$/, '');
            if (!secret) throw new CliError('--client-secret-file is empty');
          }
          body = {
            type: o.type,
            ...(o.oidcIssuer !== undefined ? { issuer: o.oidcIssuer } : {}),
            ...(o.metadataUrl !== undefined ? { metadata_url: o.metadataUrl } : {}),
            ...(o.clientId !== undefined ? { client_id: o.clientId } : {}),
            ...(secret !== undefined ? { client_secret: secret } : {}),
            ...(o.groupsAttribute !== undefined ? { groups_attribute: o.groupsAttribute } : {}),
            ...(o.scope !== undefined ? { scopes: o.scope } : {}),
          };
        }
        const { body: saved } = await ctx.client.call({
          method: 'PUT',
          path: path`/api/v1/orgs/${org}/idp-connectors/${connector}`,
          body,
        });
        await ctx.print(saved);
      }),
  );

  group.addCommand(
    withOrg(
      operatorCommand('delete', 'delete a connector', { routes: ['DELETE /api/v1/orgs/{org}/idp-connectors/{name}'] }),
    )
      .argument('<name>', 'connector name')
      .operatorAction<{ org?: string }>(async (ctx, [name], o) => {
        const org = requireOrg(o.org);
        await ctx.client.call({
          method: 'DELETE',
          path: path`/api/v1/orgs/${org}/idp-connectors/${slug(name, 'connector name')}`,
        });
        ctx.note(`connector ${name} deleted from org ${org}`);
      }),
  );
  return group;
}
