import type { Command } from 'commander';
import { operatorCommand } from '../operator/operator-command.ts';

// dvx whoami: the caller's own identity and effective capabilities (spec: "Routes named with a partial
// contract", GET /api/v1/whoami; it needs only a valid token).

export function whoamiCommand(): Command {
  return operatorCommand('whoami', "show who the token is and what it may do (the control plane's whoami)", {
    routes: ['GET /api/v1/whoami'],
  }).operatorAction(async (ctx) => {
    const { body } = await ctx.client.call({ method: 'GET', path: '/api/v1/whoami' });
    await ctx.print(body);
  });
}
