import { Command } from 'commander';
import { MAX_SECRET_BYTES, SECRET_NAME } from '../../enclave/broker/secrets.ts';
import { CliError } from '../errors.ts';
import { readInput } from '../operator/json-input.ts';
import { operatorCommand } from '../operator/operator-command.ts';
import { path } from '../operator/operator-client.ts';

// dvx secret: the enclave's secrets, authored on the broker's operator listener (--broker), in the
// token's org, at org scope (no flag: where `llmproxy:llm.api_key` lives), a group's or an agent's. A
// value is read from stdin or --file, never from an argument: argv is visible to every user of the
// machine (ps, /proc/PID/cmdline) and kept in shell history. No answer carries a value.

interface SecretScopeFlags {
  agent?: string;
  group?: string;
}

function scopeQuery(o: SecretScopeFlags): Record<string, string | undefined> {
  if (o.agent !== undefined && o.group !== undefined)
    throw new CliError('--agent and --group are alternatives: a secret has one scope');
  for (const [flag, v] of [
    ['--agent', o.agent],
    ['--group', o.group],
  ] as const)
    if (v !== undefined && !/^[^\p{C}\s]{1,200}$/u.test(v)) throw new CliError(`${flag} must be an id, got "${v}"`);
  return { agent: o.agent, group: o.group };
}

function checkedName(name: string): string {
  if (!SECRET_NAME.test(name))
    throw new CliError(`secret name "${name}" must be 1 to 200 characters of A-Z a-z 0-9 . _ : -`);
  return name;
}

const scopeText = (o: SecretScopeFlags) =>
  o.agent !== undefined ? `agent ${o.agent}` : o.group !== undefined ? `group ${o.group}` : "the token's org";

/** The value from stdin or a file: UTF-8 text, one trailing line break dropped (`echo … |` adds one). */
export function secretValue(bytes: Buffer): string {
  let text: string;
  try {
    text = new TextDecoder('utf-8', { fatal: true }).decode(bytes);
  } catch {
    throw new CliError('the secret value is not UTF-8 text');
  }
  text = text.replace(/\r?\n$/, '');
  if (text === '') throw new CliError('the secret value is empty');
  if (Buffer.byteLength(text, 'utf8') > MAX_SECRET_BYTES)
    throw new CliError(`the secret value is larger than ${MAX_SECRET_BYTES} bytes`);
  return text;
}

export function secretCommand(): Command {
  const secret = new Command('secret').description(
    "the enclave's secrets (on the broker; values from stdin or a file)",
  );
  const scoped = <C extends Command>(c: C): C =>
    c
      .option('--agent <uid>', "an agent's secret")
      .option('--group <group>', "a group's secret (neither: the token's org)");

  secret.addCommand(
    operatorCommand('list', "the secrets of the token's org (names and scopes, never values)", {
      brokerRoutes: ['GET /api/v1/secrets'],
    }).operatorAction(async (ctx) => {
      const { body } = await ctx.client.call({ method: 'GET', path: '/api/v1/secrets', target: 'broker' });
      await ctx.print(body, { columns: ['name', 'scope', 'updated_at'] });
    }),
  );
  secret.addCommand(
    scoped(
      operatorCommand('set', 'set a secret; the value is read from stdin, or from --file', {
        brokerRoutes: ['PUT /api/v1/secrets/{name}'],
      })
        .argument('<name>')
        .option('--file <file>', 'read the value from this file (default: stdin)'),
    ).operatorAction<SecretScopeFlags & { file?: string }>(async (ctx, [name], o) => {
      checkedName(name);
      const query = scopeQuery(o);
      const value = secretValue(await readInput(o.file ?? '-', 'the secret value'));
      const { body } = await ctx.client.call({
        method: 'PUT',
        path: path`/api/v1/secrets/${name}`,
        query,
        body: { value },
        target: 'broker',
      });
      await ctx.print(body);
    }),
  );
  secret.addCommand(
    scoped(
      operatorCommand('delete', 'delete a secret', { brokerRoutes: ['DELETE /api/v1/secrets/{name}'] }).argument(
        '<name>',
      ),
    ).operatorAction<SecretScopeFlags>(async (ctx, [name], o) => {
      checkedName(name);
      const query = scopeQuery(o);
      await ctx.client.call({ method: 'DELETE', path: path`/api/v1/secrets/${name}`, query, target: 'broker' });
      ctx.note(`deleted secret ${name} of ${scopeText(o)}`);
    }),
  );
  return secret;
}
