import t from 'tap';
import { validateGatewayOptions } from '../../../proxy/egress/options.ts';
import { validateOptions } from '../../../proxy/llm/options.ts';
import { runDvx } from '../../fixtures/run-dvx.ts';

// --max-buffered-bodies-per-agent as an operator sets it, on llmproxy and the gateway: flag or
// DVX_MAX_BUFFERED_BODIES_PER_AGENT, 0 (the default) = half of --max-buffered-bodies, never more than
// it, anything else refused before the server starts. What the share does is
// test/proxy/llm/body-budget-share.test.ts and test/proxy/egress/body-budget-share.test.ts.
const llmproxy = ['serve', 'llmproxy', '--tls-cert', 'cert.pem', '--tls-key', 'key.pem', '--agent-jwks', 'jwks.json'];

t.test('llmproxy: flag or environment, checked', async (t) => {
  for (const [args, env, message] of [
    [
      ['--max-buffered-bodies-per-agent', '-1'],
      {},
      /--max-buffered-bodies-per-agent <bytes>' argument '-1' is invalid/,
    ],
    [[], { DVX_MAX_BUFFERED_BODIES_PER_AGENT: 'half' }, /DVX_MAX_BUFFERED_BODIES_PER_AGENT.*invalid/],
    [
      ['--max-buffered-bodies', '1000', '--max-buffered-bodies-per-agent', '1001'],
      {},
      /--max-buffered-bodies-per-agent must not exceed --max-buffered-bodies/,
    ],
  ] as [string[], Record<string, string>, RegExp][]) {
    const r = await runDvx([...llmproxy, ...args], { env });
    t.equal(r.code, 2, `${args.join(' ')} ${JSON.stringify(env)}: ${r.stderr}`);
    t.match(r.stderr, message);
  }
  const help = (await runDvx(['serve', 'llmproxy', '--help'])).stdout.replace(/\s+/g, ' ');
  t.match(
    help,
    /--max-buffered-bodies-per-agent <bytes> .*?half of --max-buffered-bodies \(default: 0, env: DVX_MAX_BUFFERED_BODIES_PER_AGENT\)/,
  );
});

t.test('gateway: the same flag', async (t) => {
  const help = (await runDvx(['serve', 'gateway', '--help'])).stdout.replace(/\s+/g, ' ');
  t.match(
    help,
    /--max-buffered-bodies-per-agent <bytes> .*?half of --max-buffered-bodies \(default: 0, env: DVX_MAX_BUFFERED_BODIES_PER_AGENT\)/,
  );
});

t.test('0 is half the budget; a share is a byte count no larger than the budget', async (t) => {
  const llm = { tlsCert: 'c', tlsKey: 'k', agentJwks: 'j' };
  t.equal(validateOptions(llm).maxBufferedBodiesPerAgent, 32 * 1024 * 1024, 'llmproxy: 32 MiB, one largest body');
  t.equal(validateOptions({ ...llm, maxBufferedBodies: 1001 }).maxBufferedBodiesPerAgent, 500);
  t.equal(validateOptions({ ...llm, maxBufferedBodiesPerAgent: 1234 }).maxBufferedBodiesPerAgent, 1234);
  t.throws(() => validateOptions({ ...llm, maxBufferedBodiesPerAgent: -1 }), /--max-buffered-bodies-per-agent/);
  t.throws(() => validateOptions({ ...llm, maxBufferedBodiesPerAgent: 0.5 }), /--max-buffered-bodies-per-agent/);
  const gw = { tlsCert: 'c', tlsKey: 'k', agentJwks: 'j' };
  t.equal(validateGatewayOptions(gw).maxBufferedBodiesPerAgent, 512 * 1024 * 1024, 'gateway: 512 MiB');
  t.throws(
    () => validateGatewayOptions({ ...gw, maxBufferedBodies: 10, maxBufferedBodiesPerAgent: 11 }),
    /--max-buffered-bodies-per-agent must not exceed --max-buffered-bodies/,
  );
});
