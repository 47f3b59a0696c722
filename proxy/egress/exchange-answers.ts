import { type GatewayAnswer, jsonAnswer } from './errors.ts';

// The answers an exchange gives of its own (docs/gateway.md, "Interception and capture", "Credential
// injection"), beside the gateway's catalogue (errors.ts ANSWERS), in the same `{type: "error", error:
// {type, message}}` shape.

export const EXCHANGE_ANSWERS = {
  /** RFC 9110 §15.5.20: the request names another host than the tunnel it came through. */
  misdirected: jsonAnswer(
    421,
    'invalid_request_error',
    "misdirected request: the request's host is not the destination of its tunnel",
  ),
  /** The request bodies held for inspection fill --max-buffered-bodies: this one is not read (core/body-budget.ts). */
  bodiesBusy: jsonAnswer(
    503,
    'overloaded_error',
    'the gateway holds as many request bodies for inspection as it may: retry later',
  ),
} as const;

/** A request the gateway will not forward as it is shaped (a smuggling shape, a bad target). */
export function refusedShape(why: string): GatewayAnswer {
  return jsonAnswer(400, 'invalid_request_error', `request refused: ${why}`);
}

/** A body in a content coding the gateway cannot undo: it cannot be inspected, so it is not sent. */
export function undecodableBody(message: string): GatewayAnswer {
  return jsonAnswer(415, 'invalid_request_error', message);
}

/**
 * An --inject-cred rule's secret is missing for the agent: refused rather than sent bare. The message
 * names the rule's host and the secret's name, never a value.
 */
export function credentialUnavailable(message: string): GatewayAnswer {
  return jsonAnswer(403, 'credential_unavailable', message);
}

/** The broker refused the agent-operator token (a contained agent). */
export function operatorTokenRefused(message: string): GatewayAnswer {
  return jsonAnswer(403, 'permission_error', message);
}
