import { Command } from 'commander';
import { CliError } from '../errors.ts';
import { fileOrFlags, readJsonBody } from '../operator/json-input.ts';
import { path } from '../operator/operator-client.ts';
import { operatorCommand } from '../operator/operator-command.ts';
import { agentUid, collect, requireOrg, slug } from '../operator/operator-ids.ts';

// dvx agent list | get UID | create UID [--group G] … | delete UID | suspend UID | isolate UID |
//   restore UID | contain UID | release UID | operator-token UID        (all --org ORG)
// An org's agents and their lifecycle (spec: agentView, createAgentReq, containmentView, "States and
// transitions", "Agent operators").

const withOrg = <C extends Command>(c: C): C => c.option('--org <org>', "the agent's org") as C;
const COLUMNS = ['uid', 'name', 'status', 'contained', 'group_id', 'enclave_id', 'image'];

interface CreateFlags {
  org?: string;
  name?: string;
  image?: string;
  command?: string[];
  enclave?: string;
  group?: string;
  pack?: string[];
  file?: string;
}

export function agentCommand(): Command {
  const group = new Command('agent').description("an org's agents: registration and lifecycle");

  group.addCommand(
    withOrg(operatorCommand('list', "the org's agents", { routes: ['GET /api/v1/orgs/{org}/agents'] })).operatorAction<{
      org?: string;
    }>(async (ctx, _a, o) => {
      const { body } = await ctx.client.call({ method: 'GET', path: path`/api/v1/orgs/${requireOrg(o.org)}/agents` });
      await ctx.print(body, { columns: COLUMNS });
    }),
  );

  group.addCommand(
    withOrg(operatorCommand('get', 'one agent', { routes: ['GET /api/v1/orgs/{org}/agents/{uid}'] }))
      .argument('<uid>', 'agent uid')
      .operatorAction<{ org?: string }>(async (ctx, [uid], o) => {
        const { body } = await ctx.client.call({
          method: 'GET',
          path: path`/api/v1/orgs/${requireOrg(o.org)}/agents/${agentUid(uid)}`,
        });
        await ctx.print(body);
      }),
  );

  group.addCommand(
    withOrg(
      operatorCommand('create', 'register an agent in the org (in a group with --group)', {
        routes: ['POST /api/v1/orgs/{org}/agents'],
      }),
    )
      .argument('[uid]', 'agent uid (or "uid" in --file)')
      .option('--name <name>', 'display name (default: the uid)')
      .option('--group <group>', 'the group the agent belongs to')
      .option('--image <image>', 'container image')
      .option('--command <arg>', 'one argument of the command it runs (repeat, in order)', collect)
      .option('--enclave <id>', 'the enclave that runs it')
      .option('--pack <name>', 'a policy pack it is governed by (repeat for more)', collect)
      .option('--file <file>', 'the request body (createAgentReq) as JSON (- for stdin), instead of the flags')
      .operatorAction<CreateFlags>(async (ctx, [uid], o) => {
        const org = requireOrg(o.org);
        const flagNames: [keyof CreateFlags, string][] = [
          ['name', '--name'],
          ['image', '--image'],
          ['command', '--command'],
          ['enclave', '--enclave'],
          ['group', '--group'],
          ['pack', '--pack'],
        ];
        fileOrFlags(
          o.file,
          flagNames.filter(([k]) => o[k] !== undefined).map(([, f]) => f),
        );
        let body: Record<string, unknown>;
        if (o.file !== undefined) body = await readJsonBody(o.file);
        else
          body = {
            name: o.name ?? uid,
            ...(o.group !== undefined ? { group: slug(o.group, '--group') } : {}),
            ...(o.image !== undefined ? { image: o.image } : {}),
            ...(o.command !== undefined ? { command: o.command } : {}),
            ...(o.enclave !== undefined ? { enclave_id: slug(o.enclave, '--enclave') } : {}),
            ...(o.pack !== undefined ? { policy_packs: o.pack } : {}),
          };
        if (uid !== undefined) body.uid = agentUid(uid);
        else agentUid(typeof body.uid === 'string' ? body.uid : undefined);
        if (typeof body.name !== 'string' || !body.name.trim()) throw new CliError('a name is required');
        const { body: created } = await ctx.client.call({
          method: 'POST',
          path: path`/api/v1/orgs/${org}/agents`,
          body,
        });
        await ctx.print(created);
      }),
  );

  group.addCommand(
    withOrg(operatorCommand('delete', 'delete an agent', { routes: ['DELETE /api/v1/orgs/{org}/agents/{uid}'] }))
      .argument('<uid>', 'agent uid')
      .operatorAction<{ org?: string }>(async (ctx, [uid], o) => {
        const org = requireOrg(o.org);
        await ctx.client.call({ method: 'DELETE', path: path`/api/v1/orgs/${org}/agents/${agentUid(uid)}` });
        ctx.note(`agent ${uid} deleted from org ${org}`);
      }),
  );

  for (const [action, description] of [
    ['suspend', 'suspend an agent (its credentials stop working until restored)'],
    ['isolate', 'isolate an agent (cut off from everything until restored)'],
    ['restore', 'restore a suspended or isolated agent'],
  ] as const) {
    group.addCommand(
      withOrg(operatorCommand(action, description, { routes: [`POST /api/v1/orgs/{org}/agents/{uid}/${action}`] }))
        .argument('<uid>', 'agent uid')
        .operatorAction<{ org?: string }>(async (ctx, [uid], o) => {
          const { body } = await ctx.client.call({
            method: 'POST',
            path: path`/api/v1/orgs/${requireOrg(o.org)}/agents/${agentUid(uid)}/${action}`,
            body: {},
          });
          await ctx.print(body);
        }),
    );
  }

  for (const [action, contained, description] of [
    ['contain', true, 'contain an agent: its enclave stops its traffic at once'],
    ['release', false, 'release a contained agent'],
  ] as const) {
    group.addCommand(
      withOrg(operatorCommand(action, description, { routes: ['POST /api/v1/orgs/{org}/agents/{uid}/containment'] }))
        .argument('<uid>', 'agent uid')
        .operatorAction<{ org?: string }>(async (ctx, [uid], o) => {
          const { body } = await ctx.client.call({
            method: 'POST',
            path: path`/api/v1/orgs/${requireOrg(o.org)}/agents/${agentUid(uid)}/containment`,
            body: { contained },
          });
          await ctx.print(body);
        }),
    );
  }

  group.addCommand(
    withOrg(
      operatorCommand(
        'operator-token',
        'mint a short-lived agent-operator token for the agent (printed: it is the answer)',
        {
          routes: ['POST /api/v1/orgs/{org}/agents/{agent}/operator-token'],
        },
      ),
    )
      .argument('<uid>', 'agent uid')
      .operatorAction<{ org?: string }>(async (ctx, [uid], o) => {
        const { body } = await ctx.client.call({
          method: 'POST',
          path: path`/api/v1/orgs/${requireOrg(o.org)}/agents/${agentUid(uid)}/operator-token`,
        });
        await ctx.print(body);
      }),
  );
  return group;
}
