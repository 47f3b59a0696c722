import { Command } from 'commander';
import { CliError } from '../errors.ts';
import { operatorCommand } from '../operator/operator-command.ts';
import { path } from '../operator/operator-client.ts';
import { EXIT_NOT_FOUND } from '../exit-codes.ts';

// dvx flags: the org feature flags (llm-content-policy.md: Processing model 2–3, Endpoints: PUT
// /api/v1/feature-flags/{flag} {enabled}) of the token's org: `inspect:llm` and `audit:llm`, enabled
// when never set.

export const FLAGS = ['inspect:llm', 'audit:llm'];

function checkedFlag(flag: string): string {
  if (!FLAGS.includes(flag)) throw new CliError(`unknown feature flag "${flag}" (one of ${FLAGS.join(', ')})`);
  return flag;
}

export function flagsCommand(): Command {
  const flags = new Command('flags').description("the token's org's feature flags (inspect:llm, audit:llm)");
  flags.addCommand(
    operatorCommand('list', 'every flag and whether it is enabled', {
      routes: ['GET /api/v1/feature-flags'],
    }).operatorAction(async (ctx) => {
      const { body } = await ctx.client.call({ method: 'GET', path: '/api/v1/feature-flags' });
      await ctx.print(body, { columns: ['flag', 'org_id', 'enabled'] });
    }),
  );
  flags.addCommand(
    operatorCommand('get', 'one flag', { routes: ['GET /api/v1/feature-flags'] })
      .argument('<flag>', FLAGS.join(' or '))
      .operatorAction(async (ctx, [flag]) => {
        checkedFlag(flag);
        const { body } = await ctx.client.call<{ flag: string }[]>({ method: 'GET', path: '/api/v1/feature-flags' });
        const row = body.find((r) => r.flag === flag);
        if (!row) throw new CliError(`the control plane serves no flag ${flag}`, EXIT_NOT_FOUND);
        await ctx.print(row);
      }),
  );
  for (const [verb, enabled] of [
    ['enable', true],
    ['disable', false],
  ] as const)
    flags.addCommand(
      operatorCommand(verb, `${verb} a flag for the token's org`, { routes: ['PUT /api/v1/feature-flags/{flag}'] })
        .argument('<flag>', FLAGS.join(' or '))
        .operatorAction(async (ctx, [flag]) => {
          checkedFlag(flag);
          const { body } = await ctx.client.call({
            method: 'PUT',
            path: path`/api/v1/feature-flags/${flag}`,
            body: { enabled },
          });
          await ctx.print(body);
        }),
    );
  flags.addCommand(
    operatorCommand('set', 'set a flag: dvx flags set FLAG true|false', {
      routes: ['PUT /api/v1/feature-flags/{flag}'],
    })
      .argument('<flag>', FLAGS.join(' or '))
      .argument('<enabled>', 'true or false')
      .operatorAction(async (ctx, [flag, value]) => {
        checkedFlag(flag);
        if (value !== 'true' && value !== 'false') throw new CliError(`enabled must be true or false, got "${value}"`);
        const { body } = await ctx.client.call({
          method: 'PUT',
          path: path`/api/v1/feature-flags/${flag}`,
          body: { enabled: value === 'true' },
        });
        await ctx.print(body);
      }),
  );
  return flags;
}
