import t from 'tap';
import { chooseUpstream } from '../../cli/dev.ts';
import { runDvx } from '../fixtures/run-dvx.ts';

// Which model upstream `dvx dev` uses: the built-in mock unless a provider key is in the environment,
// `--upstream` deciding explicitly; a choice that cannot work is refused before anything starts.

t.test('the mock by default, the providers when a key is set', async (t) => {
  t.same(chooseUpstream('', {}), { upstream: 'mock', providerKey: '' });
  t.same(chooseUpstream('', { OPENAI_API_KEY: 'sk-o' }), { upstream: 'providers', providerKey: 'sk-o' });
  t.same(chooseUpstream('', { ANTHROPIC_API_KEY: 'sk-a', OPENAI_API_KEY: 'sk-o' }), {
    upstream: 'providers',
    providerKey: 'sk-a',
  });
  t.same(chooseUpstream('mock', { ANTHROPIC_API_KEY: 'sk-a' }), { upstream: 'mock', providerKey: '' }, 'never sent');
});

t.test('an upstream that cannot work is refused, with nothing started', async (t) => {
  t.throws(() => chooseUpstream('providers', {}), /needs ANTHROPIC_API_KEY or OPENAI_API_KEY/);
  t.throws(() => chooseUpstream('openrouter', {}), /must be "mock" or "providers"/);
  const r = await runDvx(['dev', '--dir', '/nonexistent/never-made', '--upstream', 'nope']);
  t.equal(r.code, 2, r.stderr);
  t.match(r.stderr, /--upstream must be "mock" or "providers"/);
});

t.test('a profile name the CLI could not use is refused before anything starts', async (t) => {
  const r = await runDvx(['dev', '--dir', '/nonexistent/never-made', '--profile-name', '../x']);
  t.equal(r.code, 2, r.stderr);
  t.match(r.stderr, /profile name "\.\.\/x"/);
});
