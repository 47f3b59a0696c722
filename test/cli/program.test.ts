import t from 'tap';
import { runDvx } from '../fixtures/run-dvx.ts';

t.test('dvx --help lists the commands', async (t) => {
  const r = await runDvx(['--help']);
  t.equal(r.code, 0);
  t.match(r.stdout, /serve \[component\]/);
  t.match(r.stdout, /inspect/);
});

t.test('dvx serve: an unknown component is a clear error', async (t) => {
  const unknown = await runDvx(['serve', 'toaster']);
  t.equal(unknown.code, 2);
  t.match(unknown.stderr, /unknown component "toaster" \(known: llmproxy, gateway, controlplane/);
  const none = await runDvx(['serve']);
  t.equal(none.code, 2);
  t.match(none.stderr, /name a component/);
});

t.test('an unknown command or flag exits 2', async (t) => {
  t.equal((await runDvx(['frobnicate'])).code, 2);
  t.equal((await runDvx(['inspect', '--policy', 'x', '--nope'])).code, 2);
});
