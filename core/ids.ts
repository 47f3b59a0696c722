import hyperid from 'hyperid';

// One generator per process: hyperid ids are unique across processes (UUID prefix + counter) and cost
// ~10 ns each, so every audit record, finding batch and request can carry one.
//
// No id starts with `-`. A generator's ids all share its random prefix, and base64url gives `-` as its
// first character once in 64: every approval, agent or request id of such a process then read as an
// option on a command line (`dvx approvals approve -TEB…` → "unknown option"). A generator whose ids
// would start with `-` is replaced by a new one (a new random prefix); the counter's wrap, which makes
// hyperid draw a new prefix, is covered the same way.

/** A source of ids from fresh hyperid generators, none starting with `-` (exported for its test). */
export function idSource(): () => string {
  let generate = hyperid({ urlSafe: true });
  return () => {
    let id = generate();
    while (id.charCodeAt(0) === 0x2d) {
      generate = hyperid({ urlSafe: true });
      id = generate();
    }
    return id;
  };
}

const source = idSource();

export function newId(): string {
  return source();
}
