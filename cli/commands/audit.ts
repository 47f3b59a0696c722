import { Command, Option } from 'commander';
import { AuditQueryError } from '../../audit-wal/errors.ts';
import { KNOWN_ACTOR_KINDS, KNOWN_OUTCOMES, parseAuditParams } from '../../audit-wal/query.ts';
import { CliError } from '../errors.ts';
import { type ActionContext, operatorCommand } from '../operator/operator-command.ts';
import { path } from '../operator/operator-client.ts';
import { follow } from '../operator/sse-follow.ts';
import { printStreamed, str } from '../operator/stream-lines.ts';

// dvx audit: the audit read API (operator-api.md: the audit routes, Events "Audit tail") of the control
// plane, or with --local the enclave broker's own (its sovereign store, authorized by its own grants).
// Every query parameter of the spec is a flag; they are checked here by the stores' own parser
// (audit-wal/query.ts) before anything is sent. `tail` follows /api/v1/audit/stream with reconnect and
// Last-Event-ID, so a restart of the server loses nothing and repeats nothing.

interface FilterFlags {
  org?: string;
  scope?: string;
  agent?: string;
  action?: string;
  outcome?: string;
  actorKind?: string;
  proto?: string;
  dstHost?: string;
  since?: string;
  until?: string;
  limit?: string;
  offset?: string;
  local?: boolean;
}

function addFilters(c: Command, paging: boolean): Command {
  c.option('--org <org>', 'only this org (a platform reader; ignored for an org reader)')
    .option('--scope <scope>', 'only records of this scope (org:acme, agent:bot-1, …)')
    .option('--agent <uid>', "only this agent's records (agent_id)")
    .option('--action <action>', 'only this action (grant.create, policy.put, …)')
    .addOption(new Option('--outcome <outcome>', 'only this outcome').choices(KNOWN_OUTCOMES))
    .addOption(new Option('--actor-kind <kind>', 'only this kind of actor').choices(KNOWN_ACTOR_KINDS))
    .option('--proto <proto>', 'only network flows of this protocol (tcp, udp, …)')
    .option('--dst-host <host>', 'only network flows to this host')
    .option('--since <time>', 'from this RFC 3339 time (2026-11-22T10:00:00Z)')
    .option('--until <time>', 'until this RFC 3339 time');
  if (paging)
    c.option('--limit <n>', 'at most n records').option(
      '--offset <n>',
      'skip the first n (the previous page printed it)',
    );
  return c.option('--local', "the enclave broker's own audit (--broker) instead of the control plane's");
}

/** The query the flags give, checked by the stores' parser: a malformed one is exit 2, nothing sent. */
function auditQuery(o: FilterFlags): Record<string, string | undefined> {
  const q: Record<string, string | undefined> = {
    org: o.org,
    scope: o.scope,
    agent_id: o.agent,
    action: o.action,
    outcome: o.outcome,
    actor_kind: o.actorKind,
    proto: o.proto,
    dst_host: o.dstHost,
    since: o.since,
    until: o.until,
    limit: o.limit,
    offset: o.offset,
  };
  for (const k of Object.keys(q)) if (q[k] === undefined) delete q[k];
  try {
    parseAuditParams(q);
  } catch (err) {
    if (err instanceof AuditQueryError) {
      const flag = err.field === 'agent_id' ? 'agent' : err.field.replace(/_/g, '-');
      throw new CliError(`--${flag}: ${err.message.slice(err.field.length + 2)}`);
    }
    throw err;
  }
  return q;
}

const columns = ['event_time', 'outcome', 'action', 'actor', 'resource', 'org_id', 'agent_id'];
const compact = (r: Record<string, unknown>) => [
  str(r.event_time),
  str(r.outcome),
  str(r.action),
  str(r.actor),
  r.resource !== undefined ? `→ ${str(r.resource)}` : undefined,
  str(r.org_id),
  str(r.agent_id),
];

export function auditCommand(): Command {
  const audit = new Command('audit').description(
    'read and tail the audit trail (the control plane, or with --local the broker)',
  );
  const target = (o: FilterFlags) => (o.local ? 'broker' : 'controlplane') as 'broker' | 'controlplane';

  const list = operatorCommand('list', 'audit records, filtered (every query parameter of the spec is a flag)', {
    routes: ['GET /api/v1/audit/events'],
    brokerRoutes: ['GET /api/v1/audit/events'],
  });
  addFilters(list, true);
  audit.addCommand(
    list.operatorAction<FilterFlags>(async (ctx, _a, o) => {
      const { body } = await ctx.client.call({
        method: 'GET',
        path: '/api/v1/audit/events',
        query: auditQuery(o),
        target: target(o),
      });
      await ctx.print(body, { rowsField: 'records', columns });
    }),
  );

  const tail = operatorCommand('tail', 'follow new audit records as they are written (Ctrl-C stops)', {
    routes: ['GET /api/v1/audit/stream'],
    brokerRoutes: ['GET /api/v1/audit/stream'],
  });
  addFilters(tail, false);
  tail.option('--after <id>', "resume after this event id (a previous tail's last)");
  audit.addCommand(
    tail.operatorAction<FilterFlags & { after?: string }>(async (ctx: ActionContext, _a, o) => {
      await follow(
        ctx.client,
        { path: '/api/v1/audit/stream', query: auditQuery(o), target: target(o) },
        {
          signal: ctx.signal,
          lastEventId: o.after,
          onNote: (n) => ctx.note(n),
          onEvent: async (e) => {
            // `event: end` says why the server ended the stream; follow() opens it again.
            if (e.event !== null && e.event !== 'message') return;
            await printStreamed(ctx, JSON.parse(e.data) as Record<string, unknown>, compact);
          },
        },
      );
    }),
  );

  audit.addCommand(
    operatorCommand('agent', "an agent's LLM audit log, with findings", {
      routes: ['GET /api/v1/agents/{id}/audit-log'],
    })
      .argument('<uid>', 'the agent')
      .option('--limit <n>', 'at most n entries')
      .option('--offset <n>', 'skip the first n (the previous page printed it)')
      .operatorAction<{ limit?: string; offset?: string }>(async (ctx, [uid], o) => {
        const query = { limit: o.limit, offset: o.offset };
        for (const k of ['limit', 'offset'] as const)
          if (query[k] !== undefined && !/^\d{1,9}$/.test(query[k] as string))
            throw new CliError(`--${k} must be a non-negative integer`);
        const { body } = await ctx.client.call({
          method: 'GET',
          path: path`/api/v1/agents/${uid}/audit-log`,
          query,
        });
        await ctx.print(body, {
          rowsField: 'entries',
          columns: ['event_time', 'agent_id', 'model', 'status', 'decision', 'findings'],
        });
      }),
  );
  return audit;
}
