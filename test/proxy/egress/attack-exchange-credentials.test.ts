import type { IncomingMessage, ServerResponse } from 'node:http';
import t from 'tap';
import { request } from 'undici';
import { validateSnapshot } from '../../../pipeline/policy/snapshot.ts';
import { parseRawAnswer } from '../../fixtures/raw-tls.ts';
import { until } from '../../fixtures/eventually.ts';
import { AGENT_SECRET, flowOf, GITHUB_TOKEN, snapshotDoc, startHarness } from './intercept-harness.ts';
import { exchangeRaw, openTunnel } from './intercept-tunnel.ts';

// Ways an agent could get a credential the gateway adds (--inject-cred, an agent-operator token) into
// its own hands, or keep using it once it may no longer.

t.setTimeout(90_000);

const RULE = 'host=dest.test,header=Authorization,secret=github_token,format=Bearer {}';
const SECRETS = { 'agent:agent-1': { db_password: AGENT_SECRET, github_token: GITHUB_TOKEN } };

t.test('TRACE with a credential the gateway adds is refused: the destination would echo it back', async (t) => {
  // RFC 9110 §9.3.8: a TRACE answer is the request as received, headers included.
  const echo = (req: IncomingMessage, res: ServerResponse) => {
    const body = JSON.stringify(req.headers);
    res.writeHead(200, { 'content-type': 'message/http', 'content-length': Buffer.byteLength(body) }).end(body);
  };
  const injecting = await startHarness({ options: { injectCred: [RULE] }, secrets: SECRETS });
  t.teardown(() => injecting.close());
  const routing = await startHarness({ controlPlane: true });
  t.teardown(() => routing.close());
  injecting.upstream.handle = echo;
  routing.cp!.handle = echo;
  for (const [h, host, up, what] of [
    [injecting, 'dest.test', injecting.upstream, 'an --inject-cred host'],
    [routing, 'cp.test', routing.cp!, 'the control plane'],
  ] as const) {
    const tunnel = await openTunnel(h, host, up.port);
    const text = await exchangeRaw(tunnel, `TRACE /api/v1/echo HTTP/1.1\r\nHost: ${host}:${up.port}\r\n\r\n`);
    const answer = parseRawAnswer(text);
    t.equal(answer.status, 403, what);
    t.match(JSON.parse(answer.body), { error: { type: 'credential_unavailable', message: /TRACE/ } }, what);
    t.notOk(text.includes(GITHUB_TOKEN) || text.includes('op-token-for'), `${what}: no credential came back`);
    t.equal(up.seen.length, 0, `${what}: nothing was sent`);
    t.ok(await until(() => h.flows().some((r) => /TRACE/.test(String(r.reason)))), `${what}: recorded`);
    t.equal(h.events().length, 0, `${what}: no credential was presented`);
  }

  // A host without a credential of the gateway's: TRACE is the agent's business.
  const tunnel = await openTunnel(injecting, 'other.test', injecting.upstream.port);
  const plain = parseRawAnswer(
    await exchangeRaw(tunnel, `TRACE /plain HTTP/1.1\r\nHost: other.test:${injecting.upstream.port}\r\n\r\n`),
  );
  t.equal(plain.status, 200);
});

t.test('an agent suspended or contained while its tunnel is open: its next request is refused', async (t) => {
  const h = await startHarness({ options: { injectCred: [RULE] }, secrets: SECRETS });
  t.teardown(() => h.close());
  const host = `dest.test:${h.upstream.port}`;
  const tunnel = await openTunnel(h, 'dest.test', h.upstream.port);
  const socket = tunnel.tls!;
  let text = '';
  socket.on('data', (d: Buffer) => (text += d.toString('latin1')));
  socket.write(`GET /before HTTP/1.1\r\nHost: ${host}\r\n\r\n`);
  t.ok(await until(() => /\r\n\r\nok$/.test(text)), 'answered while the agent is active');
  t.equal(h.upstream.seen.at(-1)?.headers.authorization, `Bearer ${GITHUB_TOKEN}`);

  for (const change of [{ contained: true }, { status: 'suspended' }]) {
    const doc = snapshotDoc() as { agents: Record<string, Record<string, unknown>> };
    doc.agents['agent-1'] = { ...doc.agents['agent-1'], ...change };
    const snapshot = validateSnapshot(doc);
    h.deps.snapshot = () => snapshot;
    const path = `/after-${Object.keys(change)[0]}`;
    const at = text.length;
    socket.write(`GET ${path} HTTP/1.1\r\nHost: ${host}\r\n\r\n`);
    t.ok(await until(() => /\r\n\r\n\S/.test(text.slice(at)), 5000), 'answered');
    const answer = parseRawAnswer(text.slice(at));
    t.equal(answer.status, 403, JSON.stringify(change));
    t.match(JSON.parse(answer.body), { error: { type: 'permission_error' } });
    t.ok(await until(() => flowOf(h, path) !== undefined));
    t.match(flowOf(h, path), { outcome: 'deny', reason: /contained|suspended/ });
  }
  socket.destroy();
  t.equal(h.upstream.seen.length, 1, 'nothing more reached the destination, no credential went out');
});

t.test('agent-operator token: presented on the operator API only, not to other control-plane paths', async (t) => {
  const h = await startHarness({ controlPlane: true });
  t.teardown(() => h.close());
  const cp = h.cp!;
  const token = 'op-token-for-agent-1-0123456789';
  // The control plane's token facade relays the request's Authorization to the identity provider and
  // its answer back: the agent's token must not ride along.
  const facade = await request(`https://cp.test:${cp.port}/oauth/token`, {
    dispatcher: h.proxy(),
    method: 'POST',
    headers: { 'content-type': 'application/x-www-form-urlencoded' },
    body: 'grant_type=client_credentials',
  });
  t.equal(facade.statusCode, 200);
  await facade.body.text();
  t.equal(cp.seen.at(-1)?.url, '/oauth/token');
  t.equal(cp.seen.at(-1)?.headers.authorization, undefined, 'no token outside /api/v1/');
  for (const path of ['/api/v1/audit/events?limit=1', '/api/v1']) {
    const api = await request(`https://cp.test:${cp.port}${path}`, { dispatcher: h.proxy() });
    t.equal(api.statusCode, 200);
    await api.body.text();
    t.equal(cp.seen.at(-1)?.headers.authorization, `Bearer ${token}`, `${path}: the token`);
  }
  t.equal(h.events().filter((e) => e.action === 'agent-operator-token.present').length, 2, 'two presentations');
});
