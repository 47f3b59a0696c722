import { Command } from 'commander';
import { path } from '../operator/operator-client.ts';
import { operatorCommand } from '../operator/operator-command.ts';
import { requireOrg, slug } from '../operator/operator-ids.ts';
import { CliError } from '../errors.ts';

// dvx members list | set SUBJECT | group-add SUBJECT --group G | group-remove SUBJECT --group G |
//   offboard SUBJECT | effective SUBJECT   (all --org ORG)
// An org's people (spec: memberView, putMemberReq, offboardUserView, effectiveView).

const withOrg = <C extends Command>(c: C): C => c.option('--org <org>', 'the org') as C;

/** A subject is the IdP's `sub`: any non-empty string without control characters. */
function subjectOf(s: string | undefined): string {
  if (!s || /[\u0000-\u001f\u007f]/.test(s) || s.length > 255)
    throw new CliError(`subject ${JSON.stringify(s ?? '')} is not valid`);
  return s;
}

export function membersCommand(): Command {
  const group = new Command('members').description("an org's members and their group memberships");

  group.addCommand(
    withOrg(
      operatorCommand('list', "the org's members", { routes: ['GET /api/v1/orgs/{org}/members'] }).operatorAction<{
        org?: string;
      }>(async (ctx, _a, o) => {
        const { body } = await ctx.client.call({
          method: 'GET',
          path: path`/api/v1/orgs/${requireOrg(o.org)}/members`,
        });
        await ctx.print(body, { columns: ['subject', 'username', 'email'] });
      }),
    ),
  );

  group.addCommand(
    withOrg(
      operatorCommand('set', 'add a member or change their username and email', {
        routes: ['PUT /api/v1/orgs/{org}/members/{subject}'],
      })
        .argument('<subject>', "the person's subject at the identity provider")
        .option('--username <name>', 'username')
        .option('--email <email>', 'email address')
        .operatorAction<{ org?: string; username?: string; email?: string }>(async (ctx, [subject], o) => {
          const org = requireOrg(o.org);
          const body = {
            ...(o.username !== undefined ? { username: o.username } : {}),
            ...(o.email !== undefined ? { email: o.email } : {}),
          };
          const { body: member } = await ctx.client.call({
            method: 'PUT',
            path: path`/api/v1/orgs/${org}/members/${subjectOf(subject)}`,
            body,
          });
          await ctx.print(member);
        }),
    ),
  );

  for (const [name, method, description, done] of [
    ['group-add', 'PUT', 'add a member to a group', 'added to'],
    ['group-remove', 'DELETE', 'remove a member from a group', 'removed from'],
  ] as const) {
    group.addCommand(
      withOrg(
        operatorCommand(name, description, {
          routes: [`${method} /api/v1/orgs/{org}/groups/{group}/members/{subject}`],
        })
          .argument('<subject>', "the member's subject")
          .option('--group <group>', 'the group')
          .operatorAction<{ org?: string; group?: string }>(async (ctx, [subject], o) => {
            const org = requireOrg(o.org);
            if (o.group === undefined) throw new CliError('--group GROUP is required');
            const g = slug(o.group, '--group');
            await ctx.client.call({
              method,
              path: path`/api/v1/orgs/${org}/groups/${g}/members/${subjectOf(subject)}`,
            });
            ctx.note(`${subject} ${done} group ${g} in org ${org}`);
          }),
      ),
    );
  }

  group.addCommand(
    withOrg(
      operatorCommand('offboard', 'offboard a person from the org (spec: offboardUserView)', {
        routes: ['POST /api/v1/orgs/{org}/members/{subject}/offboard'],
      })
        .argument('<subject>', "the member's subject")
        .operatorAction<{ org?: string }>(async (ctx, [subject], o) => {
          const org = requireOrg(o.org);
          const { body } = await ctx.client.call({
            method: 'POST',
            path: path`/api/v1/orgs/${org}/members/${subjectOf(subject)}/offboard`,
          });
          await ctx.print(body);
        }),
    ),
  );

  group.addCommand(
    withOrg(
      operatorCommand('effective', "a member's groups and effective capabilities in the org", {
        routes: ['GET /api/v1/orgs/{org}/members/{subject}/effective'],
      })
        .argument('<subject>', "the member's subject")
        .operatorAction<{ org?: string }>(async (ctx, [subject], o) => {
          const org = requireOrg(o.org);
          const { body } = await ctx.client.call({
            method: 'GET',
            path: path`/api/v1/orgs/${org}/members/${subjectOf(subject)}/effective`,
          });
          await ctx.print(body);
        }),
    ),
  );
  return group;
}
