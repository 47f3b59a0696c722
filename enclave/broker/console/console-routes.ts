import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import type { FastifyInstance } from 'fastify';

// The approvals console for people (docs/approvals.md, "The approvals page"): one self-contained page,
// GET /approvals on the operator listener, that lists the pending tool calls of the operator's org, follows
// the live feed and approves or denies. It carries no data: everything it shows it fetches from
// /api/v1/approvals with the bearer token the person pastes, so the page itself needs no authentication.
// Its Content-Security-Policy allows exactly its own inline script and style (by hash) and requests to
// this origin: no other script, frame, form target or origin.

const PAGE = readFileSync(new URL('./approvals-page.html', import.meta.url));

const inline = (tag: string): string => {
  const text = PAGE.toString('utf8');
  const match = new RegExp(`<${tag}>([\\s\\S]*?)</${tag}>`).exec(text);
  if (!match) throw new Error(`approvals-page.html has no <${tag}>`);
  return `'sha256-${createHash('sha256').update(match[1]).digest('base64')}'`;
};

export const CONSOLE_HEADERS = Object.freeze({
  'content-type': 'text/html; charset=utf-8',
  'cache-control': 'no-store',
  'content-security-policy': [
    "default-src 'none'",
    `script-src ${inline('script')}`,
    `style-src ${inline('style')}`,
    "connect-src 'self'",
    "img-src 'self'",
    "base-uri 'none'",
    "form-action 'none'",
    "frame-ancestors 'none'",
  ].join('; '),
  'x-content-type-options': 'nosniff',
  'x-frame-options': 'DENY',
  'referrer-policy': 'no-referrer',
  'cross-origin-opener-policy': 'same-origin',
});

export async function consoleRoutes(app: FastifyInstance): Promise<void> {
  app.get('/approvals', async (_req, reply) => reply.headers(CONSOLE_HEADERS).send(PAGE));
}
