import t from 'tap';
import { runDvx } from '../../fixtures/run-dvx.ts';

// --max-buffered-bodies on llmproxy as an operator sets it, on the real binary: flag or
// DVX_MAX_BUFFERED_BODIES, default 64 MiB, anything but a positive byte count refused before the server
// starts. What the budget does is test/proxy/llm/overload.test.ts.
const llmproxy = ['serve', 'llmproxy', '--tls-cert', 'cert.pem', '--tls-key', 'key.pem', '--agent-jwks', 'jwks.json'];

t.test('flag or environment, checked', async (t) => {
  for (const [args, env, message] of [
    [['--max-buffered-bodies', '-1'], {}, /--max-buffered-bodies <bytes>' argument '-1' is invalid/],
    [['--max-buffered-bodies', 'lots'], {}, /--max-buffered-bodies <bytes>' argument 'lots' is invalid/],
    [[], { DVX_MAX_BUFFERED_BODIES: '1.5' }, /DVX_MAX_BUFFERED_BODIES.*invalid/],
    [['--max-buffered-bodies', '0'], {}, /--max-buffered-bodies must be a positive byte count/],
  ] as [string[], Record<string, string>, RegExp][]) {
    const r = await runDvx([...llmproxy, ...args], { env });
    t.equal(r.code, 2, `${args.join(' ')} ${JSON.stringify(env)}: ${r.stderr}`);
    t.match(r.stderr, message);
  }
  const help = (await runDvx(['serve', 'llmproxy', '--help'])).stdout.replace(/\s+/g, ' ');
  t.match(help, /--max-buffered-bodies <bytes> .*?\(default: 67108864, env: DVX_MAX_BUFFERED_BODIES\)/);
});
