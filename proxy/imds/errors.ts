import { coded } from '../../core/errors.ts';

// imds's error catalogue (docs/errors.md, "proxy/imds") and its answers.
//
// Answers take the `{type: "error", error: {type, message}}` shape of llmproxy's and the gateway's: an
// agent's code reads one error shape from every satellite. They are built once; a message that names
// something (a secret, a path) is built per answer and never holds a secret's value.

export interface ImdsAnswer {
  status: number;
  body: Buffer;
  contentType: string;
}

export function errorAnswer(status: number, type: string, message: string): ImdsAnswer {
  return {
    status,
    body: Buffer.from(JSON.stringify({ type: 'error', error: { type, message } })),
    contentType: 'application/json',
  };
}

export const ANSWERS = {
  methodNotAllowed: errorAnswer(405, 'invalid_request_error', 'imds answers GET only'),
  bodyRefused: errorAnswer(400, 'invalid_request_error', 'imds requests carry no body'),
  badPath: errorAnswer(400, 'invalid_request_error', 'the request target must be a path (origin-form)'),
  badEncoding: errorAnswer(400, 'invalid_request_error', 'the path is not valid percent-encoded UTF-8'),
  noConfig: errorAnswer(404, 'not_found_error', 'imds serves no config: it was started without --config-snapshot'),
  noCa: errorAnswer(404, 'not_found_error', 'imds serves no CA: it was started without --imds-ca-cert'),
  caUnavailable: errorAnswer(503, 'api_error', 'the CA bundle of --imds-ca-cert cannot be read'),
  secretsUnavailable: errorAnswer(
    503,
    'secrets_unavailable',
    'the secret broker has not answered yet: no credential can be served until it does',
  ),
  auditUnavailable: errorAnswer(
    503,
    'audit_unavailable',
    'Request rejected: the audit record could not be made durable.',
  ),
  shuttingDown: errorAnswer(503, 'overloaded_error', 'imds is shutting down'),
  internal: errorAnswer(500, 'api_error', 'imds failed to answer; see its log'),
} as const;

export function notFound(message: string): ImdsAnswer {
  return errorAnswer(404, 'not_found_error', message);
}

/** The options given to `dvx serve imds` do not hold together (the start is refused). */
export class ImdsOptionsError extends coded('DVX_IMDS_OPTIONS') {}

/**
 * The `--imds-socket` path cannot be served: another server answers on it, it is something other than
 * a socket, or its directory cannot be made. imds never removes what is not its own stale socket.
 */
export class ImdsSocketError extends coded('DVX_IMDS_SOCKET') {}
