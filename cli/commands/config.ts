import { Command } from 'commander';
import { CliError } from '../errors.ts';
import { readJsonInput } from '../operator/json-input.ts';
import { operatorCommand } from '../operator/operator-command.ts';
import { path } from '../operator/operator-client.ts';
import { addScopeOptions, type ScopeFlags, scopeLabel, scopeQuery } from '../operator/scope-flags.ts';
import { EXIT_NOT_FOUND } from '../exit-codes.ts';

// dvx config: config values at platform, org, group or agent scope (operator-api.md: POST/DELETE
// /api/v1/config/{key}, configValueReq → configValueView; GET /api/v1/config lists a scope). A value is
// any JSON, from --value (parsed as JSON, else taken as a string), --file or stdin; `--secret` declares
// the key secret and carries no value (secret values are authored enclave-side: dvx secret).

/** The server's key form (config-values.ts), checked before anything is sent. */
const KEY = /^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$/;

function checkedKey(key: string): string {
  if (!KEY.test(key)) throw new CliError(`config key "${key}" must be 1–128 letters, digits, ".", "_", ":" or "-"`);
  return key;
}

interface Row {
  key: string;
  scope: string;
  value: unknown;
  locked: boolean;
  secret: boolean;
}

export function configCommand(): Command {
  const config = new Command('config').description('config values per scope (platform, org, group, agent)');
  const columns = ['key', 'scope', 'locked', 'secret', 'value'];

  config.addCommand(
    addScopeOptions(
      operatorCommand('list', 'the values set at a scope (platform when no scope is given)', {
        routes: ['GET /api/v1/config'],
      }),
    ).operatorAction<ScopeFlags>(async (ctx, _args, o) => {
      const { body } = await ctx.client.call({ method: 'GET', path: '/api/v1/config', query: scopeQuery(o) });
      await ctx.print(body, { columns });
    }),
  );

  config.addCommand(
    addScopeOptions(
      operatorCommand('get', 'one value at a scope', { routes: ['GET /api/v1/config'] }).argument('<key>'),
    ).operatorAction<ScopeFlags>(async (ctx, [key], o) => {
      checkedKey(key);
      const query = scopeQuery(o);
      const { body } = await ctx.client.call<Row[]>({ method: 'GET', path: '/api/v1/config', query });
      const row = body.find((r) => r.key === key);
      if (!row) throw new CliError(`${key} is not set at ${scopeLabel(query)}`, EXIT_NOT_FOUND);
      await ctx.print(row);
    }),
  );

  config.addCommand(
    addScopeOptions(
      operatorCommand('set', 'set a value at a scope', { routes: ['POST /api/v1/config/{key}'] })
        .argument('<key>')
        .option('--value <json>', 'the value: JSON (true, 3, {"a":1}, "text"), or else taken as a string')
        .option('--file <file>', 'the value as a JSON document (- for stdin)')
        .option('--secret', 'declare the key secret: no value (it is authored enclave-side, dvx secret set)')
        .option('--lock', 'lock it: more specific scopes cannot override it (refused at agent scope)'),
    ).operatorAction<ScopeFlags & { value?: string; file?: string; secret?: boolean; lock?: boolean }>(
      async (ctx, [key], o) => {
        checkedKey(key);
        const query = scopeQuery(o);
        const given = [o.value !== undefined, o.file !== undefined, !!o.secret].filter(Boolean).length;
        if (given !== 1) throw new CliError('give exactly one of --value, --file or --secret');
        if (o.lock && query.scope === 'agent') throw new CliError('--lock is refused at agent scope');
        const body: Record<string, unknown> = {};
        if (o.secret) body.secret = true;
        else if (o.file !== undefined) body.value = await readJsonInput(o.file);
        else body.value = jsonOrString(o.value as string);
        if (o.lock) body.locked = true;
        const { body: answer } = await ctx.client.call({
          method: 'POST',
          path: path`/api/v1/config/${key}`,
          query,
          body,
        });
        await ctx.print(answer);
      },
    ),
  );

  config.addCommand(
    addScopeOptions(
      operatorCommand('delete', 'remove a value at a scope', { routes: ['DELETE /api/v1/config/{key}'] }).argument(
        '<key>',
      ),
    ).operatorAction<ScopeFlags>(async (ctx, [key], o) => {
      checkedKey(key);
      const query = scopeQuery(o);
      await ctx.client.call({ method: 'DELETE', path: path`/api/v1/config/${key}`, query });
      ctx.note(`deleted ${key} at ${scopeLabel(query)}`);
    }),
  );
  return config;
}

function jsonOrString(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}
