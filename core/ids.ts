import hyperid from 'hyperid';

// One generator per process: hyperid ids are unique across processes (UUID prefix + counter) and cost
// ~10 ns each, so every audit record, finding batch and request can carry one.
const generate = hyperid({ urlSafe: true });

export function newId(): string {
  return generate();
}
