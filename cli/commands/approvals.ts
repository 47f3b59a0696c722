import { Command, Option } from 'commander';
import { APPROVAL_STATUSES } from '../../enclave/broker/approvals/view.ts';
import { CliError } from '../errors.ts';
import { operatorCommand } from '../operator/operator-command.ts';
import { path } from '../operator/operator-client.ts';
import { follow } from '../operator/sse-follow.ts';
import { printStreamed, str } from '../operator/stream-lines.ts';

// dvx approvals: the approval loop on the broker's operator listener (--broker), over the token's org:
// list, read, approve or deny (with a reason), and watch the live feed (GET /api/v1/approvals/stream,
// followed with reconnect and Last-Event-ID: docs/cli.md, "Following streams").

const ID = /^[A-Za-z0-9_-]{1,64}$/;
/** The broker's reason form: no control or invisible characters but line breaks and tabs; 1024 at most. */
const REASON = /^(?:[^\p{C}]|[\n\t])*$/u;
const MAX_REASON = 1024;

function checkedId(id: string): string {
  if (!ID.test(id)) throw new CliError(`approval id "${id}" must be 1–64 letters, digits, "_" or "-"`);
  return id;
}

const compact = (a: Record<string, unknown>) => [
  str(a.created_at),
  str(a.status),
  str(a.id),
  str(a.agent_id),
  str(a.tool),
  str(a.summary),
];

export function approvalsCommand(): Command {
  const approvals = new Command('approvals').description("the enclave's approval requests (on the broker)");
  const columns = ['id', 'status', 'agent_id', 'tool', 'summary', 'created_at', 'expires_at', 'decided_by'];

  approvals.addCommand(
    operatorCommand('list', "approvals of the token's org, newest first", { brokerRoutes: ['GET /api/v1/approvals'] })
      .addOption(new Option('--status <status>', 'only this status').choices(APPROVAL_STATUSES))
      .option('--agent <uid>', "only this agent's")
      .option('--limit <n>', 'at most n (1–500; the broker answers 100 by default)')
      .option('--offset <n>', 'skip the first n (the previous page printed the next offset)')
      .operatorAction<{ status?: string; agent?: string; limit?: string; offset?: string }>(async (ctx, _a, o) => {
        if (o.limit !== undefined && !/^\d{1,3}$/.test(o.limit)) throw new CliError('--limit must be an integer 1–500');
        if (o.offset !== undefined && !/^\d{1,7}$/.test(o.offset)) throw new CliError('--offset must be an integer');
        if (o.agent !== undefined && !/^[^\p{C}\s]{1,200}$/u.test(o.agent)) throw new CliError('--agent must be an id');
        const { body } = await ctx.client.call({
          method: 'GET',
          path: '/api/v1/approvals',
          query: { status: o.status, agent: o.agent, limit: o.limit, offset: o.offset },
          target: 'broker',
        });
        await ctx.print(body, { rowsField: 'approvals', columns });
      }),
  );
  approvals.addCommand(
    operatorCommand('get', 'one approval', { brokerRoutes: ['GET /api/v1/approvals/{id}'] })
      .argument('<id>')
      .operatorAction(async (ctx, [id]) => {
        const { body } = await ctx.client.call({
          method: 'GET',
          path: path`/api/v1/approvals/${checkedId(id)}`,
          target: 'broker',
        });
        await ctx.print(body);
      }),
  );
  for (const verb of ['approve', 'deny'] as const)
    approvals.addCommand(
      operatorCommand(verb, `${verb} a pending approval`, { brokerRoutes: [`POST /api/v1/approvals/{id}/${verb}`] })
        .argument('<id>')
        .option('--reason <text>', 'why (recorded with the decision and in the audit)')
        .operatorAction<{ reason?: string }>(async (ctx, [id], o) => {
          checkedId(id);
          if (o.reason !== undefined && (!REASON.test(o.reason) || o.reason.length > MAX_REASON))
            throw new CliError(
              `--reason must be at most ${MAX_REASON} characters without control or invisible characters`,
            );
          const { body } = await ctx.client.call({
            method: 'POST',
            path: path`/api/v1/approvals/${id}/${verb}`,
            body: o.reason ? { reason: o.reason } : {},
            target: 'broker',
          });
          await ctx.print(body);
        }),
    );
  approvals.addCommand(
    operatorCommand('watch', "follow changes of the org's approvals as they happen (Ctrl-C stops)", {
      brokerRoutes: ['GET /api/v1/approvals/stream'],
    })
      .option('--after <id>', "resume after this event id (a previous watch's last)")
      .operatorAction<{ after?: string }>(async (ctx, _a, o) => {
        await follow(
          ctx.client,
          { path: '/api/v1/approvals/stream', target: 'broker' },
          {
            signal: ctx.signal,
            lastEventId: o.after,
            onNote: (n) => ctx.note(n),
            onEvent: async (e) => {
              if (e.event !== 'approval') return;
              await printStreamed(ctx, JSON.parse(e.data) as Record<string, unknown>, compact);
            },
          },
        );
      }),
  );
  return approvals;
}
