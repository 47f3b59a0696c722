// Exit codes of the command-line jobs. `dvx inspect` documents 0, 1 and 2 in the issue; 3 is ours.
export const EXIT_OK = 0;
/** `dvx inspect`: a finding blocks in this phase. */
export const EXIT_BLOCKED = 1;
/** Bad usage, or an unreadable or invalid input. */
export const EXIT_USAGE = 2;
/** `dvx inspect --inspect-fail-closed`: inspection could not run, so the body is refused. */
export const EXIT_UNAVAILABLE = 3;
