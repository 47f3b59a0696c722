// llmproxy's answers of its own, built once (DESIGN.md: hot-path errors are constant buffers). The
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
  return { status, body: Buffer.from(JSON.stringify({ type: 'error', error: { type, message } })), contentType: 'application/json' };
}

export const ERRORS = {
  contentPolicy: jsonError(403, 'content_policy_violation', 'Request blocked by content security policy.'),
  inspectionUnavailable: jsonError(503, 'content_inspection_unavailable', 'Request rejected: content security inspection is unavailable.'),
  upstreamFailed: { status: 502, body: Buffer.from('Upstream request failed'), contentType: 'text/plain; charset=utf-8' } as ProxyError,
  unauthenticated: jsonError(401, 'authentication_error', 'invalid or missing agent credential'),
  agentRefused: jsonError(403, 'permission_error', 'agent is not permitted to use the LLM proxy'),
  tierTooLow: jsonError(403, 'permission_error', 'enclave isolation class is below the required minimum'),
  noCredential: jsonError(500, 'api_error', 'no LLM API credential configured'),
  tooLarge: jsonError(413, 'request_too_large', 'request body exceeds 32 MB'),
  notFound: jsonError(404, 'not_found_error', 'no such route'),
  methodNotAllowed: jsonError(405, 'invalid_request_error', 'method not allowed'),
  bodyTimeout: jsonError(408, 'timeout_error', 'request body not received in time'),
  shuttingDown: jsonError(503, 'overloaded_error', 'proxy is shutting down'),
  unsupportedMediaType: jsonError(415, 'invalid_request_error', 'content-type must be application/json'),
  encodedBody: jsonError(415, 'invalid_request_error', 'content-encoding: request bodies must be sent uncompressed (identity)'),
  modelRequired: jsonError(400, 'invalid_request_error', 'model: a string model is required'),
  auditUnavailable: jsonError(503, 'audit_unavailable', 'Request rejected: the audit record could not be made durable.'),
} as const;

export function badRequest(message: string): ProxyError {
  return jsonError(400, 'invalid_request_error', message);
}

/** The answer to a request node refused before it reached the proxy (oversized headers, a malformed request, one that did not arrive in time), in the same shape. */
export function clientErrorAnswer(status: number): { contentType: string; body: string } {
  const [type, message] = status === 431 ? ['request_too_large', 'request header fields too large']
    : status === 408 ? ['timeout_error', 'request not received in time'] : ['invalid_request_error', 'malformed HTTP request'];
  return { contentType: 'application/json', body: JSON.stringify({ type: 'error', error: { type, message } }) };
}
