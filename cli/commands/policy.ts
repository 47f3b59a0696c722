import { Command, Option } from 'commander';
import { PolicyValidationError } from '../../pipeline/errors.ts';
import { patternProblem } from '../../pipeline/inspectors/patterns.ts';
import { validateGovernance, type GovernanceKind } from '../../pipeline/policy/governance.ts';
import { SETTING_KEYS, validateSetting, type SettingKey } from '../../pipeline/policy/snapshot.ts';
import { CliError, ProblemAnswerError } from '../errors.ts';
import { readJsonInput } from '../operator/json-input.ts';
import { type ActionContext, operatorCommand } from '../operator/operator-command.ts';
import { type OperatorClient, path } from '../operator/operator-client.ts';
import { addScopeOptions, type ScopeFlags, scopeLabel, scopeOf, scopeQuery } from '../operator/scope-flags.ts';
import { EXIT_NOT_FOUND } from '../exit-codes.ts';

// dvx policy: the LLM policy keys of service llmproxy (llm-content-policy.md: Policy keys, Policy
// hierarchy, Endpoints) at platform, org and agent scope, and the governance kinds (operator-api.md:
// llmPolicyReq, destinationPolicyReq, exec/ssh/tunnel, tunnel ports) at platform, org, group and agent
// scope, plus an agent's effective policy. A value is checked here by the proxy's own validators
// (pipeline/policy) before anything is sent, so an invalid one fails with exit 2 and the server is
// never asked; the server checks it again.
//
// The LLM keys have no group scope (the spec names it for governance policy only), and their org scope
// is the token's org (the routes take no org): `--org`, when given, is checked against whoami.

const LLM_KEYS: readonly string[] = SETTING_KEYS;
const GOVERNANCE_PATH: Record<string, GovernanceKind> = {
  llm: 'llm',
  destination: 'destination',
  exec: 'exec',
  ssh: 'ssh',
  tunnel: 'tunnel',
  'tunnel-ports': 'tunnel_ports',
};
const ALL_KEYS = [...LLM_KEYS, ...Object.keys(GOVERNANCE_PATH)];

// The platform and org LLM routes have a second spelling (llm-content-policy.md: Endpoints); the commands
// call the first and declare both, since both are the same route.
const PLATFORM_LLM = ['/api/v1/platform/config/llmproxy', '/api/v1/platform-config/llmproxy'];
const ORG_LLM = ['/api/v1/config/llmproxy', '/api/v1/service-config/llmproxy'];

type Key = { kind: 'llm'; key: SettingKey } | { kind: 'governance'; key: string; gov: GovernanceKind };

function keyOf(raw: string): Key {
  if (LLM_KEYS.includes(raw)) return { kind: 'llm', key: raw as SettingKey };
  const normalized = raw === 'tunnel_ports' ? 'tunnel-ports' : raw;
  const gov = Object.hasOwn(GOVERNANCE_PATH, normalized) ? GOVERNANCE_PATH[normalized] : undefined;
  if (gov) return { kind: 'governance', key: normalized, gov };
  throw new CliError(`unknown policy key "${raw}" (one of ${ALL_KEYS.join(', ')})`);
}

interface PolicyRow {
  key: string;
  scope: string;
  value: unknown;
  locked: boolean;
}

/** The LLM key's scope, checked: platform, the token's org (`--org` must be it), or an agent. */
async function llmScope(
  client: OperatorClient,
  o: ScopeFlags,
): Promise<{ scope: 'platform' } | { scope: 'org' } | { scope: 'agent'; agent: string }> {
  const scope = scopeOf(o);
  if (scope === 'group')
    throw new CliError('the LLM policy keys have no group scope (llm-content-policy.md: Policy hierarchy)');
  const q = scopeQuery(o);
  if (scope === 'agent') return { scope, agent: q.agent as string };
  if (scope === 'org') {
    const who = await client.call<{ org_id?: string }>({ method: 'GET', path: '/api/v1/whoami' });
    if (who.body.org_id !== o.org)
      throw new CliError(
        `the LLM keys' org scope is the token's org (${who.body.org_id || 'none'}), not --org ${o.org}: use a token of that org`,
      );
    return { scope };
  }
  return { scope };
}

/** An LLM row as the API lists it (its value JSON-encoded) with the value decoded. */
function decoded(r: { key: string; scope: string; value: string; locked: boolean }): PolicyRow {
  let value: unknown = r.value;
  try {
    value = JSON.parse(r.value);
  } catch {
    // Shown as stored: the server keeps only values that parse, so this is not expected.
  }
  return { key: r.key, scope: r.scope, value, locked: r.locked };
}

async function llmRows(client: OperatorClient, o: ScopeFlags): Promise<PolicyRow[]> {
  const s = await llmScope(client, o);
  const p =
    s.scope === 'platform' ? PLATFORM_LLM[0] : s.scope === 'org' ? ORG_LLM[0] : path`/api/v1/agents/${s.agent}/config`;
  const { body } = await client.call<{ key: string; scope: string; value: string; locked: boolean }[]>({
    method: 'GET',
    path: p,
  });
  return body.map(decoded);
}

async function governanceRow(client: OperatorClient, key: string, o: ScopeFlags): Promise<PolicyRow | null> {
  try {
    const { body } = await client.call<PolicyRow>({
      method: 'GET',
      path: path`/api/v1/policies/${key}`,
      query: scopeQuery(o),
    });
    return body;
  } catch (err) {
    // "no exec policy at org:acme": an unset kind. Any other 404 (no such org or agent) is the answer.
    if (err instanceof ProblemAnswerError && err.status === 404 && /policy at /.test(err.message)) return null;
    throw err;
  }
}

/** The proxy's validator over an LLM value, with the authoring checks the control plane adds (policy.ts). */
export function validateLlmValue(key: SettingKey, value: unknown, atAgent: boolean, locked: boolean): void {
  let valid: unknown;
  try {
    valid = validateSetting(key, value, key);
  } catch (err) {
    if (err instanceof PolicyValidationError) throw new CliError(`invalid ${key}: ${err.message}`);
    throw err;
  }
  if (key === 'content_inspection')
    (valid as { patterns: { pattern: string }[] }).patterns.forEach((p, i) => {
      const problem = patternProblem(p.pattern);
      if (problem)
        throw new CliError(
          `invalid ${key}: content_inspection.patterns[${i}].pattern: not an RE2 expression (${problem})`,
        );
    });
  if (atAgent && locked)
    throw new CliError('--lock is refused at agent scope (llm-content-policy.md: Policy hierarchy)');
  if (atAgent && (valid as { immutable?: unknown } | null)?.immutable === true)
    throw new CliError(`invalid ${key}: ${key}.immutable is refused at agent scope`);
}

/** The governance validator over a request body; its `locked` at agent scope is refused as the server does. */
export function validateGovernanceBody(kind: GovernanceKind, body: unknown, atAgent: boolean): void {
  let parsed: { locked: boolean };
  try {
    parsed = validateGovernance(kind, body);
  } catch (err) {
    if (err instanceof PolicyValidationError)
      throw new CliError(`invalid ${kind} policy: ${err.message.replace(/^body\./, '')}`);
    throw err;
  }
  if (parsed.locked && atAgent) throw new CliError('--lock is refused at agent scope');
}

interface SetFlags extends ScopeFlags {
  file?: string;
  lock?: boolean;
  enable?: boolean;
  disable?: boolean;
  ports?: string;
  clear?: boolean;
  allow?: string[];
  deny?: string[];
}

/** The governance request body the flags or the file give (`locked` from --lock added). */
async function governanceBody(k: Extract<Key, { kind: 'governance' }>, o: SetFlags): Promise<Record<string, unknown>> {
  const fromFlags = o.enable || o.disable || o.ports !== undefined || o.clear || o.allow || o.deny;
  if (o.file !== undefined && fromFlags)
    throw new CliError('give the value with --file or with flags (--enable, --ports, --allow …), not both');
  let body: Record<string, unknown>;
  if (o.file !== undefined) {
    const doc = await readJsonInput(o.file);
    if (!doc || typeof doc !== 'object' || Array.isArray(doc))
      throw new CliError(`--file must hold a JSON object (the ${k.key} policy body)`);
    body = { ...(doc as Record<string, unknown>) };
  } else {
    const misplaced = (flag: string, kinds: string) => new CliError(`${flag} is for ${kinds}, not ${k.key}`);
    if ((o.enable || o.disable) && !['exec', 'ssh', 'tunnel'].includes(k.key))
      throw misplaced('--enable/--disable', 'exec, ssh and tunnel');
    if ((o.ports !== undefined || o.clear) && k.key !== 'tunnel-ports')
      throw misplaced('--ports/--clear', 'tunnel-ports');
    if ((o.allow || o.deny) && k.key !== 'llm') throw misplaced('--allow/--deny', 'llm (model globs)');
    if (o.enable && o.disable) throw new CliError('--enable and --disable are alternatives');
    if (o.clear && o.ports !== undefined) throw new CliError('--clear and --ports are alternatives');
    if (o.enable || o.disable) body = { enabled: !!o.enable };
    // llm-content-policy.md, "Governance scopes for interactive access": --clear authors an empty list,
    // which denies every port.
    else if (o.clear) body = { ports: [] };
    else if (o.ports !== undefined) body = { ports: parsePorts(o.ports) };
    else if (o.allow || o.deny)
      body = { models: { ...(o.allow ? { allow: o.allow } : {}), ...(o.deny ? { deny: o.deny } : {}) } };
    else
      throw new CliError(
        k.key === 'tunnel-ports'
          ? 'give --ports P,…, --clear (an empty list: every port denied) or --file'
          : ['exec', 'ssh', 'tunnel'].includes(k.key)
            ? 'give --enable, --disable or --file'
            : 'give the policy body with --file F (or --file - for stdin)',
      );
  }
  if (o.lock) body.locked = true;
  return body;
}

function parsePorts(text: string): number[] {
  return text.split(',').map((s) => {
    const t = s.trim();
    if (!/^\d{1,5}$/.test(t)) throw new CliError(`--ports: "${t}" is not a port number`);
    return Number(t);
  });
}

export function policyCommand(): Command {
  const policy = new Command('policy').description(
    'LLM policy keys (model_policy, content_inspection, sidecar_inspection, …) and governance policy (llm, destination, exec, ssh, tunnel, tunnel-ports) per scope',
  );
  const keysHelp = `one of ${ALL_KEYS.join(', ')}`;

  policy.addCommand(
    addScopeOptions(
      operatorCommand('get', 'show one key at a scope (platform when no scope is given)', {
        routes: [
          'GET /api/v1/policies/{kind}',
          ...PLATFORM_LLM.map((p) => `GET ${p}`),
          ...ORG_LLM.map((p) => `GET ${p}`),
          'GET /api/v1/agents/{id}/config',
          'GET /api/v1/whoami',
        ],
      }).argument('<key>', keysHelp),
    ).operatorAction<ScopeFlags>(async (ctx, [raw], o) => {
      const k = keyOf(raw);
      const row =
        k.kind === 'llm'
          ? ((await llmRows(ctx.client, o)).find((r) => r.key === k.key) ?? null)
          : await governanceRow(ctx.client, k.key, o);
      if (!row)
        throw new CliError(
          `${k.key} is not set at ${k.kind === 'llm' ? llmLabel(o) : scopeLabel(scopeQuery(o))}`,
          EXIT_NOT_FOUND,
        );
      await ctx.print(row);
    }),
  );

  policy.addCommand(
    addScopeOptions(
      operatorCommand('list', 'every key set at a scope (platform when no scope is given)', {
        routes: [
          'GET /api/v1/policies/{kind}',
          ...PLATFORM_LLM.map((p) => `GET ${p}`),
          ...ORG_LLM.map((p) => `GET ${p}`),
          'GET /api/v1/agents/{id}/config',
          'GET /api/v1/whoami',
        ],
      }),
    ).operatorAction<ScopeFlags>(async (ctx, _args, o) => {
      scopeQuery(o);
      const rows: PolicyRow[] = scopeOf(o) === 'group' ? [] : await llmRows(ctx.client, o);
      for (const key of Object.keys(GOVERNANCE_PATH)) {
        const row = await governanceRow(ctx.client, key, o);
        if (row) rows.push(row);
      }
      await ctx.print(rows, { columns: ['key', 'scope', 'locked', 'value'] });
    }),
  );

  policy.addCommand(
    addScopeOptions(
      operatorCommand('set', 'author a key at a scope, validated here before it is sent', {
        routes: [
          'PUT /api/v1/policies/{kind}',
          ...PLATFORM_LLM.map((p) => `PUT ${p}/{key}`),
          ...ORG_LLM.map((p) => `PUT ${p}/{key}`),
          'POST /api/v1/agents/{id}/config',
          'GET /api/v1/whoami',
        ],
      })
        .argument('<key>', keysHelp)
        .option(
          '--file <file>',
          'the value as JSON (- for stdin): the policy value of an LLM key, the body of a governance kind',
        )
        .option('--lock', 'lock it: more specific scopes cannot override it (refused at agent scope)')
        .option('--enable', 'exec, ssh, tunnel: {"enabled": true}')
        .option('--disable', 'exec, ssh, tunnel: {"enabled": false}')
        .option('--ports <list>', 'tunnel-ports: the allowed ports, comma-separated')
        .option('--clear', 'tunnel-ports: an empty list, which denies every port')
        .addOption(new Option('--allow <glob...>', 'llm: model globs allowed (models.allow)'))
        .addOption(new Option('--deny <glob...>', 'llm: model globs denied (models.deny)')),
    ).operatorAction<SetFlags>(async (ctx, [raw], o) => {
      const k = keyOf(raw);
      if (k.kind === 'governance') {
        const body = await governanceBody(k, o);
        const query = scopeQuery(o);
        validateGovernanceBody(k.gov, body, query.scope === 'agent');
        const { body: answer } = await ctx.client.call({
          method: 'PUT',
          path: path`/api/v1/policies/${k.key}`,
          query,
          body,
        });
        await ctx.print(answer);
        return;
      }
      if (o.enable || o.disable || o.ports !== undefined || o.clear || o.allow || o.deny)
        throw new CliError(`${k.key} takes its value with --file F (or --file - for stdin)`);
      if (o.file === undefined) throw new CliError(`give the ${k.key} value with --file F (or --file - for stdin)`);
      const value = await readJsonInput(o.file);
      const atAgent = scopeOf(o) === 'agent';
      validateLlmValue(k.key, value, atAgent, !!o.lock);
      const s = await llmScope(ctx.client, o);
      const encoded = JSON.stringify(value);
      const answer =
        s.scope === 'agent'
          ? await ctx.client.call({
              method: 'POST',
              path: path`/api/v1/agents/${s.agent}/config`,
              body: { override_service: 'llmproxy', key: k.key, value: encoded },
            })
          : await ctx.client.call({
              method: 'PUT',
              path: `${s.scope === 'platform' ? PLATFORM_LLM[0] : ORG_LLM[0]}${path`/${k.key}`}`,
              body: { value: encoded, locked: !!o.lock },
            });
      await ctx.print(answer.body);
    }),
  );

  policy.addCommand(
    addScopeOptions(
      operatorCommand('delete', 'remove a key at a scope (the broader scopes apply again)', {
        routes: [
          'DELETE /api/v1/policies/{kind}',
          ...PLATFORM_LLM.map((p) => `DELETE ${p}/{key}`),
          ...ORG_LLM.map((p) => `DELETE ${p}/{key}`),
          'DELETE /api/v1/agents/{id}/config/{key}',
          'GET /api/v1/whoami',
        ],
      }).argument('<key>', keysHelp),
    ).operatorAction<ScopeFlags>(async (ctx, [raw], o) => {
      const k = keyOf(raw);
      if (k.kind === 'governance') {
        const query = scopeQuery(o);
        await ctx.client.call({ method: 'DELETE', path: path`/api/v1/policies/${k.key}`, query });
        ctx.note(`deleted ${k.key} at ${scopeLabel(query)}`);
        return;
      }
      const s = await llmScope(ctx.client, o);
      await ctx.client.call({
        method: 'DELETE',
        path:
          s.scope === 'agent'
            ? path`/api/v1/agents/${s.agent}/config/${k.key}`
            : `${s.scope === 'platform' ? PLATFORM_LLM[0] : ORG_LLM[0]}${path`/${k.key}`}`,
      });
      ctx.note(`deleted ${k.key} at ${llmLabel(o)}`);
    }),
  );

  policy.addCommand(
    operatorCommand('effective', "an agent's effective policy: what its enclave enforces", {
      routes: ['GET /api/v1/agents/{id}/effective-policy', 'GET /api/v1/agents/{id}/effective-governance'],
    })
      .argument('<agent>', 'the agent uid')
      .option('--governance', 'the effective governance policy (llm, destination, exec, ssh, tunnel, ports, packs)')
      .operatorAction<{ governance?: boolean }>(async (ctx: ActionContext, [agent], o) => {
        const { body } = await ctx.client.call({
          method: 'GET',
          path: o.governance
            ? path`/api/v1/agents/${agent}/effective-governance`
            : path`/api/v1/agents/${agent}/effective-policy`,
        });
        await ctx.print(body);
      }),
  );
  return policy;
}

function llmLabel(o: ScopeFlags): string {
  const scope = scopeOf(o);
  return scope === 'agent' ? `agent:${o.agent}` : scope === 'org' ? `org:${o.org}` : 'platform';
}
