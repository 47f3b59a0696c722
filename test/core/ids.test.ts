import t from 'tap';
import hyperid from 'hyperid';
import { idSource, newId } from '../../core/ids.ts';

// A generator's ids share its random prefix, whose first base64url character is `-` once in 64: such a
// process's ids all read as options on a command line (`dvx approvals approve -TEB…`). 500 fresh
// sources: without the replacement, one of them starts with `-` but for a chance of (63/64)^500 ≈ 0.04 %.

t.test('no id starts with "-", whatever prefix its generator drew', async (t) => {
  let plainDash = 0;
  for (let i = 0; i < 500; i++) {
    if (hyperid({ urlSafe: true })().startsWith('-')) plainDash++;
    const next = idSource();
    for (let k = 0; k < 3; k++) {
      const id = next();
      if (id.startsWith('-')) t.fail(`an id starts with "-": ${id}`);
    }
  }
  t.comment(`plain hyperid generators whose ids start with "-": ${plainDash} of 500`);
  t.pass('500 sources, none gave an id starting with "-"');
});

t.test('ids stay unique and url-safe', async (t) => {
  const seen = new Set<string>();
  for (let i = 0; i < 20_000; i++) seen.add(newId());
  t.equal(seen.size, 20_000, 'unique');
  t.ok(
    [...seen].every((id) => /^[A-Za-z0-9_][A-Za-z0-9_-]*$/.test(id)),
    'url-safe, no leading "-"',
  );
});
