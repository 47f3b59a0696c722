import { setTimeout as sleep } from 'node:timers/promises';
import { Command } from 'commander';
import { CliError } from '../errors.ts';
import { path } from '../operator/operator-client.ts';
import { type ActionContext, operatorCommand } from '../operator/operator-command.ts';
import { slug } from '../operator/operator-ids.ts';
import { printable } from '../operator/output.ts';

// dvx erasure create ORG [--no-wait] [--interval S] | get ORG
// Per-org erasure (spec: erasureView, erasureResultView). `create` starts it (or finds it started)
// and, unless --no-wait, polls its status until it is complete, with progress on stderr when stderr is
// a terminal. Ctrl-C stops the waiting, never the erasure: it runs on in the control plane, and
// `dvx erasure get ORG` shows where it is.

interface ErasureResult {
  org_id: string;
  status: string;
  key_shredded?: boolean;
  rows_swept?: number;
}

const EXIT_INTERRUPTED = 130;

async function status(ctx: ActionContext, org: string): Promise<ErasureResult> {
  const { body } = await ctx.client.call<ErasureResult>({ method: 'GET', path: path`/api/v1/orgs/${org}/erasure` });
  return body;
}

export function erasureCommand(): Command {
  const group = new Command('erasure').description("erase an org's data (crypto-shredding and a sweep)");

  group.addCommand(
    operatorCommand('create', 'erase an org: start it, then wait until it is complete', {
      routes: ['POST /api/v1/orgs/{org}/erasure', 'GET /api/v1/orgs/{org}/erasure'],
    })
      .argument('<org>', 'the org to erase')
      .option('--no-wait', 'return once it has started')
      .option('--interval <seconds>', 'seconds between status polls while waiting', '1')
      .operatorAction<{ wait: boolean; interval: string }>(async (ctx, [raw], o) => {
        const org = slug(raw, 'org');
        const interval = Number(o.interval);
        if (!Number.isFinite(interval) || interval < 0.1 || interval > 3600)
          throw new CliError('--interval must be a number of seconds between 0.1 and 3600');
        const { body: started } = await ctx.client.call<ErasureResult>({
          method: 'POST',
          path: path`/api/v1/orgs/${org}/erasure`,
          body: {},
        });
        if (!o.wait || started.status === 'complete') {
          await ctx.print(started.status === 'complete' ? await status(ctx, org) : started);
          return;
        }
        const progress = !!process.stderr.isTTY;
        let last: ErasureResult = started;
        while (!ctx.signal.aborted) {
          last = await status(ctx, org);
          if (last.status === 'complete') break;
          if (progress)
            process.stderr.write(
              // The status is the server's text: escaped like everything else that reaches the terminal.
              `\rerasing ${org}: ${printable(String(last.status))}, key ${last.key_shredded === true ? 'shredded' : 'not yet shredded'}, ${Number(last.rows_swept) || 0} rows swept`,
            );
          await sleep(interval * 1000, undefined, { signal: ctx.signal }).catch(() => {});
        }
        if (progress) process.stderr.write('\n');
        if (last.status !== 'complete') {
          ctx.note(`stopped waiting; the erasure of ${org} goes on (dvx erasure get ${org})`);
          process.exitCode = EXIT_INTERRUPTED;
          return;
        }
        await ctx.print(last);
      }),
  );

  group.addCommand(
    operatorCommand('get', "an org's erasure: status, key shredded, rows swept", {
      routes: ['GET /api/v1/orgs/{org}/erasure'],
    })
      .argument('<org>', 'the org')
      .operatorAction(async (ctx, [org]) => {
        await ctx.print(await status(ctx, slug(org, 'org')));
      }),
  );
  return group;
}
