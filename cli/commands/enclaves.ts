import { Argument, Command } from 'commander';
import { ISOLATION_CLASSES } from '../../pipeline/policy/snapshot.ts';
import { CliError } from '../errors.ts';
import { path } from '../operator/operator-client.ts';
import { type ActionContext, operatorCommand } from '../operator/operator-command.ts';
import { slug } from '../operator/operator-ids.ts';
import { SecretFileOut } from '../operator/secret-file-out.ts';

// dvx enclaves list | get ID | create NAME --owning-org ORG --key-out F | delete ID |
//   rotate-key ID --key-out F | set-address ID [--broker-url U] [--relay-url U] | set-isolation-class ID CLASS
// The enclave registry (spec: enclaveView, registerBrokerReq/View, addressReq). The broker key the
// control plane mints at registration and rotation is secret: it goes to --key-out FILE (0600, new).

const COLUMNS = ['enclave_id', 'name', 'owning_org_id', 'status', 'broker_url', 'relay_url'];
const keyOut = <C extends Command>(c: C): C =>
  c.option('--key-out <file>', 'write the broker key here (mode 0600, new file)') as C;

async function withBrokerKey(
  ctx: ActionContext,
  file: string | undefined,
  call: () => Promise<Record<string, unknown>>,
) {
  const out = await SecretFileOut.create(file);
  const answer = await out.around(call, (a) => a.key);
  const { key: _secret, ...rest } = answer;
  await ctx.print(rest);
  ctx.note(`the broker key is in ${out.path} (mode 0600); it is not shown again`);
}

/** An address flag: an https URL, or "" to clear it. */
function address(value: string | undefined, flag: string): string | null | undefined {
  if (value === undefined) return undefined;
  if (value === '') return null;
  let u: URL;
  try {
    u = new URL(value);
  } catch {
    throw new CliError(`${flag} ${JSON.stringify(value)} is not a URL`);
  }
  if (u.protocol !== 'https:') throw new CliError(`${flag} must be an https URL`);
  return value;
}

export function enclavesCommand(): Command {
  const group = new Command('enclaves').description('the enclave registry: brokers, their keys and addresses');

  group.addCommand(
    operatorCommand('list', 'every enclave the caller may read', { routes: ['GET /api/v1/enclaves'] }).operatorAction(
      async (ctx) => {
        const { body } = await ctx.client.call({ method: 'GET', path: '/api/v1/enclaves' });
        await ctx.print(body, { columns: COLUMNS });
      },
    ),
  );

  group.addCommand(
    operatorCommand('get', 'one enclave', { routes: ['GET /api/v1/enclaves/{id}'] })
      .argument('<id>', 'enclave id')
      .operatorAction(async (ctx, [id]) => {
        const { body } = await ctx.client.call({
          method: 'GET',
          path: path`/api/v1/enclaves/${slug(id, 'enclave id')}`,
        });
        await ctx.print(body);
      }),
  );

  group.addCommand(
    keyOut(
      operatorCommand('create', "register an enclave; its broker's key goes to --key-out", {
        routes: ['POST /api/v1/enclaves'],
      }),
    )
      .argument('<name>', 'display name')
      .option('--owning-org <org>', 'the org that owns the enclave')
      .option('--id <id>', 'enclave id (default: generated)')
      .operatorAction<{ owningOrg?: string; id?: string; keyOut?: string }>(async (ctx, [name], o) => {
        if (!name.trim()) throw new CliError('the name must not be empty');
        if (o.owningOrg === undefined) throw new CliError('--owning-org ORG is required');
        const body = {
          name,
          owning_org: slug(o.owningOrg, '--owning-org'),
          ...(o.id !== undefined ? { enclave_id: slug(o.id, '--id') } : {}),
        };
        await withBrokerKey(ctx, o.keyOut, async () => {
          const { body: answer } = await ctx.client.call<Record<string, unknown>>({
            method: 'POST',
            path: '/api/v1/enclaves',
            body,
          });
          return answer;
        });
      }),
  );

  group.addCommand(
    keyOut(
      operatorCommand('rotate-key', 'mint a new broker key (the old one stops working); it goes to --key-out', {
        routes: ['POST /api/v1/enclaves/{id}/broker-key'],
      }),
    )
      .argument('<id>', 'enclave id')
      .operatorAction<{ keyOut?: string }>(async (ctx, [id], o) => {
        const enclave = slug(id, 'enclave id');
        await withBrokerKey(ctx, o.keyOut, async () => {
          const { body } = await ctx.client.call<Record<string, unknown>>({
            method: 'POST',
            path: path`/api/v1/enclaves/${enclave}/broker-key`,
          });
          return body;
        });
      }),
  );

  group.addCommand(
    operatorCommand('set-address', 'set the broker\'s and relay\'s URLs ("" clears one)', {
      routes: ['PUT /api/v1/enclaves/{id}/address'],
    })
      .argument('<id>', 'enclave id')
      .option('--broker-url <url>', "the broker's https URL")
      .option('--relay-url <url>', "the relay's https URL")
      .operatorAction<{ brokerUrl?: string; relayUrl?: string }>(async (ctx, [id], o) => {
        const broker = address(o.brokerUrl, '--broker-url');
        const relay = address(o.relayUrl, '--relay-url');
        if (broker === undefined && relay === undefined) throw new CliError('give --broker-url, --relay-url or both');
        const { body } = await ctx.client.call({
          method: 'PUT',
          path: path`/api/v1/enclaves/${slug(id, 'enclave id')}/address`,
          body: {
            ...(broker !== undefined ? { broker_url: broker } : {}),
            ...(relay !== undefined ? { relay_url: relay } : {}),
          },
        });
        await ctx.print(body);
      }),
  );

  group.addCommand(
    operatorCommand('set-isolation-class', "set the enclave's isolation class", {
      routes: ['PUT /api/v1/enclaves/{id}/isolation-class'],
    })
      .argument('<id>', 'enclave id')
      .addArgument(new Argument('<class>', 'the isolation class').choices(ISOLATION_CLASSES))
      .operatorAction(async (ctx, [id, isolationClass]) => {
        const { body } = await ctx.client.call({
          method: 'PUT',
          path: path`/api/v1/enclaves/${slug(id, 'enclave id')}/isolation-class`,
          body: { isolationClass },
        });
        await ctx.print(body);
      }),
  );

  group.addCommand(
    operatorCommand('delete', 'remove an enclave from the registry', { routes: ['DELETE /api/v1/enclaves/{id}'] })
      .argument('<id>', 'enclave id')
      .operatorAction(async (ctx, [id]) => {
        await ctx.client.call({ method: 'DELETE', path: path`/api/v1/enclaves/${slug(id, 'enclave id')}` });
        ctx.note(`enclave ${id} deleted`);
      }),
  );
  return group;
}
