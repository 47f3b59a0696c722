import { coded } from '../core/errors.ts';

// The enclave package's error classes (the broker, the pullers), each a DvxError with a stable code
// (docs/errors.md, "enclave").

/** A broker option (flag or DVX_* variable) that is missing, malformed or inconsistent. */
export class BrokerOptionsError extends coded('DVX_BROKER_OPTIONS_INVALID') {}

/** A platform JWT presented to the broker does not verify (signature, key, issuer, lifetime, claims). */
export class PlatformJwtError extends coded('DVX_BROKER_JWT_REJECTED') {}

/** A signing key of the platform JWT cannot be made or opened (its sealed private key, an empty key store). */
export class SigningKeyError extends coded('DVX_BROKER_SIGNING_KEY') {}

/** The enclave CA files: only one of the pair exists, unreadable, not PEM, not a CA, or the key does not match. */
export class EnclaveCaError extends coded('DVX_BROKER_ENCLAVE_CA_INVALID') {}

/** A certificate signing request an agent sent does not parse, its self-signature fails, or its key is not P-256. */
export class CsrInvalidError extends coded('DVX_BROKER_CSR_INVALID') {}

/** An agent wrote a config key that a broader scope (platform, org, group) locked: answered 409. */
export class AgentConfigLockedError extends coded('DVX_BROKER_CONFIG_LOCKED') {}

/** The control plane served the state of another enclave than --enclave-id (a key or id misconfigured): not applied. */
export class EnclaveMismatchError extends coded('DVX_BROKER_ENCLAVE_MISMATCH') {}

/** An agent's state changed while the broker converged it (an exchange won the race): retried on the next pull. */
export class AgentStateChangedError extends coded('DVX_BROKER_AGENT_STATE_CHANGED') {}

/** An agent's bootstrap token could not be placed under --agent-host-dir (unsafe uid, a symlink, a write error). */
export class AgentHostDirError extends coded('DVX_BROKER_AGENT_HOST_DIR') {}

/** dvx agent-login cannot start: a missing or empty token file, an unusable output directory, a second agent-login on it. */
export class AgentLoginInputError extends coded('DVX_AGENT_LOGIN_INPUT') {}

/**
 * The broker refused an agent's exchange for good: 401 (unknown, used or revoked token), 403 (the agent is
 * suspended, isolated or contained), 409 (a replayed refresh token: the family is revoked), or another 4xx.
 */
export class AgentLoginRefusedError extends coded('DVX_AGENT_LOGIN_REFUSED') {
  readonly status: number;
  constructor(message: string, status: number, options?: ErrorOptions) {
    super(message, options);
    this.status = status;
  }
}

/**
 * The broker could not be reached, or failed (5xx, 429, a malformed answer): retried until the agent's JWT
 * expires, then the run ends with it. `retryAfterMs`: the broker's Retry-After, when it sent one.
 */
export class AgentLoginUnavailableError extends coded('DVX_AGENT_LOGIN_UNAVAILABLE') {
  readonly retryAfterMs: number | undefined;
  constructor(message: string, options?: ErrorOptions & { retryAfterMs?: number }) {
    super(message, options);
    this.retryAfterMs = options?.retryAfterMs;
  }
}

/**
 * An approval request past a limit (10 pending per agent, 100 pending per org, 50 requests per agent per
 * hour): answered 429 `approval rate limit exceeded`, and llmproxy denies the held call.
 */
export class ApprovalLimitError extends coded('DVX_BROKER_APPROVAL_LIMIT') {
  readonly limit: string;
  constructor(limit: string) {
    super('approval rate limit exceeded');
    this.limit = limit;
  }
}

/**
 * An approve of an approval whose agent may no longer act (contained, suspended, isolated, or no longer
 * in the approval's org): refused with 409 and audited; a deny of it is still taken.
 */
export class ApprovalAgentRefusedError extends coded('DVX_BROKER_APPROVAL_AGENT_REFUSED') {}

/** An approval that is no longer pending (decided, expired or cancelled) was decided or cancelled: answered 409. */
export class ApprovalSettledError extends coded('DVX_BROKER_APPROVAL_SETTLED') {
  readonly status: string;
  constructor(id: string, status: string) {
    super(`approval ${id} is ${status}, no longer pending`);
    this.status = status;
  }
}
