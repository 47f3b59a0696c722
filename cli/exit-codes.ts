// Exit codes of the command-line jobs. `dvx inspect` documents 0, 1 and 2 in the issue; 3 and 4 are ours.
export const EXIT_OK = 0;
/** `dvx inspect`: a finding blocks in this phase. */
export const EXIT_BLOCKED = 1;
/** Bad usage, or an unreadable or invalid input. */
export const EXIT_USAGE = 2;
/**
 * `dvx inspect --inspect-fail-closed`: inspection could not run, so the body is refused. `dvx agent-login`:
 * the broker stayed unreachable (or failing) until the agent's JWT expired.
 */
export const EXIT_UNAVAILABLE = 3;
/**
 * `dvx agent-login`: the broker refused the agent for good (its token unknown, used or revoked; a replayed
 * refresh token; the agent suspended, isolated or contained). Restarting does not help until an operator acts.
 */
export const EXIT_REFUSED = 4;

// The operator commands (docs/cli.md, "Exit codes"): one code per class of answer, so a script can tell
// "try again later" from "fix the request" from "you may not". 0, 2, 3 and 4 keep the meanings above.
//   2  bad usage or local validation: nothing was sent
//   3  unavailable: no answer (connection, TLS, timeout) or a 5xx
//   4  refused: 401 or 403 (the credential, or what it may do)
/** 404: what the command names does not exist (or the caller may not see it). */
export const EXIT_NOT_FOUND = 5;
/** 409 or 412: the change conflicts with the current state (locked, already settled, in use). */
export const EXIT_CONFLICT = 6;
/** Any other 4xx (400, 413, 415, 422, 429): the server refused the request as sent. */
export const EXIT_REJECTED = 7;
