import type { FastifyInstance } from 'fastify';
import { Agent, request } from 'undici';
import { dict } from '../../core/own.ts';

// POST /oauth/token (spec: "Token facade"): no bearer, not under /api/v1. The request (TokenRequest:
// grant_type, assertion, scope, as a form or JSON) goes to the issuer's token endpoint,
// `<issuer>/oauth/v2/token` or --token-endpoint-override, with the caller's client authentication;
// the issuer's answer, success or error, is passed through verbatim. Errors of the facade itself are
// OAuth 2.0 error bodies (RFC 6749 §5.2), never problem documents.

export interface TokenFacadeOptions {
  issuer: string;
  override: string;
  ca?: Buffer;
}

function oauthError(status: number, error: string, description: string) {
  return {
    status,
    body: { error, error_description: description, error_uri: 'https://www.rfc-editor.org/rfc/rfc6749#section-5.2' },
  };
}

export function tokenFacade(options: TokenFacadeOptions) {
  const endpoint = options.override || `${options.issuer.replace(/\/+$/, '')}/oauth/v2/token`;
  const dispatcher = new Agent({ connect: options.ca ? { ca: options.ca } : undefined });
  return async (app: FastifyInstance) => {
    app.addContentTypeParser('application/x-www-form-urlencoded', { parseAs: 'string' }, (_req, body, done) => {
      done(null, Object.fromEntries(new URLSearchParams(body as string)));
    });
    app.addHook('onClose', async () => dispatcher.close());
    app.post('/oauth/token', async (req, reply) => {
      const body = req.body;
      const fail = (e: ReturnType<typeof oauthError>) =>
        reply.code(e.status).header('cache-control', 'no-store').send(e.body);
      if (body === null || typeof body !== 'object' || Array.isArray(body))
        return fail(oauthError(400, 'invalid_request', 'the body must be a form or a JSON object (TokenRequest)'));
      // Keys are the caller's: `__proto__` must be a field like any other, not the object's prototype.
      const fields = dict<string>();
      for (const [k, v] of Object.entries(body as Record<string, unknown>)) {
        if (typeof v !== 'string') return fail(oauthError(400, 'invalid_request', `${k} must be a string`));
        fields[k] = v;
      }
      if (!fields.grant_type) return fail(oauthError(400, 'invalid_request', 'grant_type is required'));
      const headers: Record<string, string> = {
        'content-type': 'application/x-www-form-urlencoded',
        accept: 'application/json',
      };
      if (typeof req.headers.authorization === 'string') headers.authorization = req.headers.authorization;
      let upstream;
      try {
        upstream = await request(endpoint, {
          method: 'POST',
          headers,
          body: new URLSearchParams(fields).toString(),
          dispatcher,
          headersTimeout: 15_000,
          bodyTimeout: 15_000,
        });
      } catch (err) {
        return fail(
          oauthError(502, 'temporarily_unavailable', `the token endpoint is unreachable: ${(err as Error).message}`),
        );
      }
      const text = await upstream.body.text();
      reply.code(upstream.statusCode).header('cache-control', 'no-store');
      const type = upstream.headers['content-type'];
      if (typeof type === 'string') reply.type(type);
      return reply.send(text);
    });
  };
}
