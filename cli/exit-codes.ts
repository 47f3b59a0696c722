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
