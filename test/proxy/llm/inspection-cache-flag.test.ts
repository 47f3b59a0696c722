import t from 'tap';
import { runDvx } from '../../fixtures/run-dvx.ts';

// --inspection-cache-mb as an operator sets it, on the real binary: flag or DVX_INSPECTION_CACHE_MB,
// default 64, 0 allowed (off), anything else refused before the server starts.
const llmproxy = ['serve', 'llmproxy', '--tls-cert', 'cert.pem', '--tls-key', 'key.pem', '--agent-jwks', 'jwks.json'];

t.test('llmproxy: flag or environment, checked', async (t) => {
  for (const [args, env, message] of [
    [['--inspection-cache-mb', '-1'], {}, /--inspection-cache-mb <n>' argument '-1' is invalid/],
    [['--inspection-cache-mb', 'lots'], {}, /--inspection-cache-mb <n>' argument 'lots' is invalid/],
    [[], { DVX_INSPECTION_CACHE_MB: '1.5' }, /DVX_INSPECTION_CACHE_MB.*invalid/],
    [['--inspection-cache-mb', '70000'], {}, /--inspection-cache-mb must be a whole number from 0 \(off\) to 65536/],
    [[], { DVX_INSPECTION_CACHE_MB: '99999' }, /--inspection-cache-mb must be a whole number from 0 \(off\) to 65536/],
  ] as [string[], Record<string, string>, RegExp][]) {
    const r = await runDvx([...llmproxy, ...args], { env });
    t.equal(r.code, 2, `${args.join(' ')} ${JSON.stringify(env)}`);
    t.match(r.stderr, message);
  }
  const help = (await runDvx(['serve', 'llmproxy', '--help'])).stdout.replace(/\s+/g, ' ');
  t.match(help, /--inspection-cache-mb <n> .*?\(default: 64, env: DVX_INSPECTION_CACHE_MB\)/);
});

t.test('gateway: the same flag', async (t) => {
  const r = await runDvx(['serve', 'gateway', '--inspection-cache-mb', 'lots']);
  t.equal(r.code, 2);
  t.match(r.stderr, /--inspection-cache-mb <n>' argument 'lots' is invalid/);
  const help = (await runDvx(['serve', 'gateway', '--help'])).stdout.replace(/\s+/g, ' ');
  t.match(help, /--inspection-cache-mb <n> .*?\(default: 64, env: DVX_INSPECTION_CACHE_MB\)/);
});
