import { type Command, Option } from 'commander';
import { CliError } from '../errors.ts';

// The scope of a config value, a governance policy or a pack installation (operator-api.md; the control
// plane reads it from the query string): `--scope platform|org|group|agent` (platform when not given),
// `--org`, `--group`, `--agent`. Checked here as the server checks it, so a wrong combination fails
// before anything is sent.

export const SCOPES = ['platform', 'org', 'group', 'agent'] as const;
export type ScopeKind = (typeof SCOPES)[number];

export interface ScopeFlags {
  scope?: string;
  org?: string;
  group?: string;
  agent?: string;
}

export function addScopeOptions<C extends Command>(command: C): C {
  return command
    .addOption(new Option('--scope <scope>', 'platform (default), org, group or agent').choices(SCOPES))
    .option('--org <org>', 'the org (org and group scope; optional at agent scope)')
    .option('--group <group>', 'the group (group scope)')
    .option('--agent <uid>', 'the agent (agent scope)');
}

/** The scope the flags name; `--agent` alone implies agent scope, `--group` group scope, `--org` org scope. */
export function scopeOf(o: ScopeFlags): ScopeKind {
  if (o.scope) return o.scope as ScopeKind;
  if (o.agent) return 'agent';
  if (o.group) return 'group';
  if (o.org) return 'org';
  return 'platform';
}

/** The query parameters of the scope, or a usage error saying what is missing or extra. */
export function scopeQuery(o: ScopeFlags): Record<string, string | undefined> {
  const scope = scopeOf(o);
  for (const [name, v] of [
    ['--org', o.org],
    ['--group', o.group],
    ['--agent', o.agent],
  ] as const)
    if (v !== undefined && (v === '' || /[\p{C}\s]/u.test(v))) throw new CliError(`${name} must be an id, got "${v}"`);
  switch (scope) {
    case 'platform':
      if (o.org || o.group || o.agent) throw new CliError('platform scope takes no --org, --group or --agent');
      return { scope };
    case 'org':
      if (!o.org) throw new CliError('org scope needs --org');
      if (o.group || o.agent) throw new CliError('org scope takes no --group or --agent');
      return { scope, org: o.org };
    case 'group':
      if (!o.org || !o.group) throw new CliError('group scope needs --org and --group');
      if (o.agent) throw new CliError('group scope takes no --agent');
      return { scope, org: o.org, group: o.group };
    case 'agent':
      if (!o.agent) throw new CliError('agent scope needs --agent');
      if (o.group) throw new CliError('agent scope takes no --group (the agent names its own)');
      return { scope, agent: o.agent, org: o.org };
  }
}

/** How the scope reads in a note: `platform`, `org:acme`, `group:acme:ops`, `agent:bot-1`. */
export function scopeLabel(q: Record<string, string | undefined>): string {
  return q.scope === 'platform'
    ? 'platform'
    : q.scope === 'org'
      ? `org:${q.org}`
      : q.scope === 'group'
        ? `group:${q.org}:${q.group}`
        : `agent:${q.agent}`;
}
