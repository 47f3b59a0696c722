import { coded } from '../../core/errors.ts';

// The gateway's error catalogue (docs/errors.md, "proxy/egress") and its answers of its own.
//
// Answers are built once. They take the `{type: "error", error: {type, message}}` shape llmproxy's
// do (an agent's SDK parses it), except the spec's exact 502 `Upstream request failed` (text). A
// destination refusal names the rule's reason: the agent (and its operator) must be able to tell why.

export interface GatewayAnswer {
  status: number;
  body: Buffer;
  contentType: string;
}

export function jsonAnswer(status: number, type: string, message: string): GatewayAnswer {
  return {
    status,
    body: Buffer.from(JSON.stringify({ type: 'error', error: { type, message } })),
    contentType: 'application/json',
  };
}

/** `Proxy-Authenticate` of every 407. */
export const PROXY_AUTHENTICATE = 'Bearer realm="dvx-gateway"';

export const ANSWERS = {
  /** No credential, or one that does not verify: 407 with Proxy-Authenticate. */
  proxyAuthRequired: jsonAnswer(
    407,
    'authentication_error',
    'proxy authentication required: a platform JWT in Proxy-Authorization: Bearer, or an identity certificate',
  ),
  agentRefused: jsonAnswer(403, 'permission_error', 'agent is not permitted to use the gateway'),
  contentPolicy: jsonAnswer(403, 'content_policy_violation', 'Request blocked by content security policy.'),
  inspectionUnavailable: jsonAnswer(
    503,
    'content_inspection_unavailable',
    'Request rejected: content security inspection is unavailable.',
  ),
  /** The spec's answer when llmproxy cannot be reached; also any destination that cannot be reached. */
  upstreamFailed: {
    status: 502,
    body: Buffer.from('Upstream request failed'),
    contentType: 'text/plain; charset=utf-8',
  } as GatewayAnswer,
  upstreamTimeout: jsonAnswer(504, 'timeout_error', 'the destination did not answer in time'),
  auditUnavailable: jsonAnswer(
    503,
    'audit_unavailable',
    'Request rejected: the audit record could not be made durable.',
  ),
  shuttingDown: jsonAnswer(503, 'overloaded_error', 'gateway is shutting down'),
  /** Too many name lookups waiting (lookup-limits.ts): refused at once rather than queued without end. */
  lookupsBusy: jsonAnswer(503, 'overloaded_error', 'too many destination name lookups in progress; try again'),
  tooLarge: jsonAnswer(413, 'request_too_large', 'request body exceeds 32 MB'),
} as const;

/** A 403 naming why the destination is refused (the rule's reason, or the gateway's). */
export function destinationRefused(reason: string): GatewayAnswer {
  return jsonAnswer(403, 'destination_denied', `destination refused: ${reason}`);
}

/** A 400 for a request the gateway cannot forward (a bad CONNECT target, a relative URL, …). */
export function badProxyRequest(message: string): GatewayAnswer {
  return jsonAnswer(400, 'invalid_request_error', message);
}

/** The options given to `dvx serve gateway` do not hold together. */
export class GatewayOptionsError extends coded('DVX_GATEWAY_OPTIONS') {}

/** An `--allow-dest`, `--deny-dest`, `--inject-cred` or `--llm-host` rule does not parse. */
export class GatewayRuleError extends coded('DVX_GATEWAY_RULE') {}

/**
 * The gateway answers the agent itself instead of forwarding (a refusal, a failure to reach the
 * destination): `answer` is the wire answer, `reason` the flow record's reason. Thrown inside a flow
 * and turned into the answer and the record in one place.
 */
export class GatewayRefusal extends coded('DVX_GATEWAY_REFUSAL') {
  readonly answer: GatewayAnswer;
  readonly reason: string;
  readonly headers: Record<string, string> | null;

  constructor(answer: GatewayAnswer, reason: string, headers: Record<string, string> | null = null) {
    super(reason);
    this.answer = answer;
    this.reason = reason;
    this.headers = headers;
  }
}

/** A credential rule's secret is missing from the secret source: the request is refused, never sent bare. */
export class MissingCredentialError extends coded('DVX_GATEWAY_MISSING_CREDENTIAL') {}

/** The broker refused or could not mint an agent-operator token (a contained agent is refused at the mint). */
export class OperatorTokenError extends coded('DVX_GATEWAY_OPERATOR_TOKEN') {
  /** The broker's status when it answered (403 for a contained agent), null when it could not be reached. */
  readonly status: number | null;

  constructor(message: string, status: number | null, options?: ErrorOptions) {
    super(message, options);
    this.status = status;
  }
}

/**
 * Too many name lookups wait already (in all, or for this agent behind its own running one): the
 * attempt is refused 503 at once instead of queued (lookup-limits.ts).
 */
export class LookupBusyError extends coded('DVX_GATEWAY_LOOKUPS_BUSY') {}
