import type { Command } from 'commander';
import { operatorCommand } from '../operator/operator-command.ts';
import { safeJson } from '../operator/output.ts';

// dvx openapi: the control plane's OpenAPI document (GET /api/v1/openapi.json), printed as JSON
// whatever --output says (a document is not a table).

export function openapiCommand(): Command {
  return operatorCommand('openapi', "print the control plane's OpenAPI document", {
    routes: ['GET /api/v1/openapi.json'],
  }).operatorAction(async (ctx) => {
    const { body } = await ctx.client.call({ method: 'GET', path: '/api/v1/openapi.json' });
    const text = ctx.settings.output === 'jsonl' ? `${safeJson(body)}\n` : `${safeJson(body, 2)}\n`;
    process.stdout.write(text);
  });
}
