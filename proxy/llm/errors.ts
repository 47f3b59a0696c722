import { coded } from '../../core/errors.ts';
import type { AgentIdentity } from './auth.ts';

// llmproxy's error catalogue (docs/errors.md, "proxy/llm") and its answers of its own.
//
// The answers are built once (hot-path errors are constant buffers). The
// 403 content_policy_violation, 503 content_inspection_unavailable and 502 bodies are the spec's
// exactly (Errors table); the others follow the same `{type: "error", error: {type, message}}` shape,
// which the official SDKs parse into their typed errors. The 403 body is generic: which inspector
// matched what goes to audit and logs only.

export interface ProxyError {
  status: number;
  body: Buffer;
  contentType: string;
}

function jsonError(status: number, type: string, message: string): ProxyError {
  return {
    status,
    body: Buffer.from(JSON.stringify({ type: 'error', error: { type, message } })),
    contentType: 'application/json',
  };
}

export const ERRORS = {
  contentPolicy: jsonError(403, 'content_policy_violation', 'Request blocked by content security policy.'),
  inspectionUnavailable: jsonError(
    503,
    'content_inspection_unavailable',
    'Request rejected: content security inspection is unavailable.',
  ),
  upstreamFailed: {
    status: 502,
    body: Buffer.from('Upstream request failed'),
    contentType: 'text/plain; charset=utf-8',
  } as ProxyError,
  unauthenticated: jsonError(401, 'authentication_error', 'invalid or missing agent credential'),
  agentRefused: jsonError(403, 'permission_error', 'agent is not permitted to use the LLM proxy'),
  tierTooLow: jsonError(403, 'permission_error', 'enclave isolation class is below the required minimum'),
  noCredential: jsonError(500, 'api_error', 'no LLM API credential configured'),
  tooLarge: jsonError(413, 'request_too_large', 'request body exceeds 32 MB'),
  notFound: jsonError(404, 'not_found_error', 'no such route'),
  bodyTimeout: jsonError(408, 'timeout_error', 'request body not received in time'),
  shuttingDown: jsonError(503, 'overloaded_error', 'proxy is shutting down'),
  overloaded: jsonError(
    503,
    'overloaded_error',
    'proxy is overloaded: too many request bodies held at once; retry later',
  ),
  unsupportedMediaType: jsonError(415, 'invalid_request_error', 'content-type must be application/json'),
  encodedBody: jsonError(
    415,
    'invalid_request_error',
    'content-encoding: request bodies must be sent uncompressed (identity)',
  ),
  modelRequired: jsonError(400, 'invalid_request_error', 'model: a string model is required'),
  toolPolicyRoute: jsonError(
    403,
    'permission_error',
    'this route is not available under a tool-call policy: its answers can carry tool calls the policy has not decided',
  ),
  auditUnavailable: jsonError(
    503,
    'audit_unavailable',
    'Request rejected: the audit record could not be made durable.',
  ),
} as const;

export function badRequest(message: string): ProxyError {
  return jsonError(400, 'invalid_request_error', message);
}

/**
 * The answer to a request node refused before it reached the proxy (oversized headers, a malformed request, one that
 * did not arrive in time), in the same shape.
 */
export function clientErrorAnswer(status: number): { contentType: string; body: string } {
  const [type, message] =
    status === 431
      ? ['request_too_large', 'request header fields too large']
      : status === 408
        ? ['timeout_error', 'request not received in time']
        : ['invalid_request_error', 'malformed HTTP request'];
  return { contentType: 'application/json', body: JSON.stringify({ type: 'error', error: { type, message } }) };
}

/** The options given to `dvx serve llmproxy` do not hold together (the CLI answers with the message). */
export class OptionsError extends coded('DVX_LLMPROXY_OPTIONS') {}

/** Why an agent's credential was refused; the `dvx_llmproxy_auth_failures_total` label. */
export type AuthFailure =
  | 'expired'
  | 'claim'
  | 'algorithm'
  | 'signed'
  | 'signature'
  | 'malformed'
  | 'rejected'
  | 'lifetime'
  | 'lacks'
  | 'agent'
  /** The gateway's identity header (gateway-identity.ts) did not verify, or names another request. */
  | 'gateway';

/** An agent presented no credential, or one that does not verify (spec: Authentication). */
export class AuthError extends coded('DVX_AGENT_AUTH') {
  /** The metric label: what about the credential failed. */
  readonly reason: AuthFailure;
  /**
   * Who the caller is, when the token's signature verified and only a claim check refused it (expired,
   * not yet valid, too long-lived): the issuer vouches for these claims, so the refusal is that
   * agent's and is audited under its org. Null when nothing about the caller can be trusted.
   */
  readonly identity: AgentIdentity | null;

  constructor(reason: AuthFailure, message: string, identity: AgentIdentity | null = null, options?: ErrorOptions) {
    super(message, options);
    this.reason = reason;
    this.identity = identity;
  }
}

/** A request body cannot be converted to the upstream's wire format (--translate); the agent gets a 400. */
export class TranslationError extends coded('DVX_TRANSLATION') {}

/** An inference body is not the JSON shape its format needs for the security-context prefix; a 400. */
export class BodyShapeError extends coded('DVX_BODY_SHAPE') {}

/** A request body does not fit in the bodies held at once (--max-buffered-bodies); a 503 overloaded_error. */
export class OverloadedError extends coded('DVX_LLMPROXY_OVERLOADED') {}

/** A request body is larger than the proxy reads (32 MB), announced or sent; a 413. */
export class RequestTooLargeError extends coded('DVX_REQUEST_TOO_LARGE') {}

/** An upstream answer held whole (a plain answer) grew past the held-answer bound; a 502. */
export class AnswerTooLargeError extends coded('DVX_ANSWER_TOO_LARGE') {}

/** The secret broker (--secret-broker-url) did not answer, refused the satellite token, or sent an unusable map. */
export class SecretBrokerError extends coded('DVX_SECRET_BROKER') {}

/**
 * The approval service (--approvals-url) could not be used: unreachable, timed out, refused the satellite
 * token, answered an unexpected status or an unusable body. The held tool call is denied (fail closed).
 */
export class ApprovalsUnavailableError extends coded('DVX_APPROVALS_UNAVAILABLE') {
  /** No answer or a 5xx: while the approval is awaited, the broker is asked again until the deadline. */
  readonly transient: boolean;

  constructor(message: string, options?: ErrorOptions & { transient?: boolean }) {
    super(message, options);
    this.transient = options?.transient === true;
  }
}

/** The broker refused a new approval past its limits (429): the tool call is denied, `approval rate limit exceeded`. */
export class ApprovalRateLimitError extends coded('DVX_APPROVAL_RATE_LIMIT') {}

/**
 * A call answered by the proxy itself, before or instead of relaying the upstream's answer: `answer` is
 * the wire body (one of ERRORS, or a 400 of badRequest). A refusal of ours carries its `reason` (the
 * record's `error`, decision `deny`); a null reason is an answer that is no refusal of ours (a block
 * keeps the pipeline's decision, an upstream failure has its error recorded already). Thrown by a step
 * and turned into the answer and its audit record in one place (proxy.ts).
 */
export class Refusal extends coded('DVX_LLMPROXY_REFUSAL') {
  readonly answer: ProxyError;
  readonly reason: string | null;
  readonly headers: Record<string, string> | null;

  constructor(answer: ProxyError, reason: string | null, headers: Record<string, string> | null = null) {
    super(reason ?? `answered ${answer.status}`);
    this.answer = answer;
    this.reason = reason;
    this.headers = headers;
  }
}
