import { join } from 'node:path';
import t from 'tap';
import { getAgent } from '../../../enclave/broker/agents.ts';
import type { AgentIdentity } from '../../../proxy/llm/auth.ts';
import { until } from '../../fixtures/eventually.ts';
import { enclaveSnapshot, startEnclave } from './e2e-enclave-plane.ts';
import { curl, viaGateway } from './gateway-harness.ts';

// P11 end to end: --cp-api-host. An agent calls the control plane's API through the gateway with no
// credential of its own for it; the gateway mints an agent-operator token through the real broker (which
// asks the real control plane with its broker key) and presents it. The control plane sees the
// agent-operator kind for the agent (whoami; its own audit trail once an org admin grants agent:<uid> the
// auditor role); the agent never sees the token; one token serves the agent's requests for its lifetime
// (one mint audited, not one per request); a contained agent is refused at the mint (403) and nothing
// reaches the control plane.

t.setTimeout(180_000);

// Tokens of 25 s: the gateway keeps one until 10 s before it expires, so a burst is one mint, and the
// renewal is seen within the test.
const e = await startEnclave({ agentTokenTtl: 25_000 });
if (!e) {
  t.comment('no PostgreSQL at 127.0.0.1:5432: the enclave end-to-end tests need one');
} else {
  t.teardown(() => e.close());
  const cpUrl = (path: string) => `https://${e.cpApiHost}/api/v1${path}`;
  const mints = (uid: string) =>
    e.cph.audit.filter((r) => r.action === 'agent-operator-token.mint' && r.resource === `agent:${uid}`);
  const identity = (uid: string): AgentIdentity => ({
    agentId: uid,
    orgId: 'org-a',
    agentName: uid,
    groupId: 'g-1',
    via: 'jwt',
    tokenHeader: null,
  });
  /** What the broker's enclave admin reads back from the shared store. */
  const enclaveAudit = async (query: string) => {
    const res = await e.broker.operator('admin-a', 'GET', `/api/v1/audit/events?${query}`);
    if (res.status !== 200) throw new Error(`broker audit read: ${res.status}`);
    return res.body.records as Record<string, unknown>[];
  };
  const answers: string[] = [];

  t.test('the control plane sees an agent-operator token for the agent, which sent none', async (t) => {
    const who = await e.get('bot-1', cpUrl('/whoami'));
    answers.push(JSON.stringify(who));
    t.equal(who.status, 200, who.text);
    t.match(JSON.parse(who.text), { subject: 'agent:bot-1', kind: 'agent-operator', org_id: 'org-a' });
    t.equal(mints('bot-1').length, 1, 'minted on the control plane');
    t.match(mints('bot-1')[0], { actor: 'enclave:enc-test', outcome: 'allow' }, 'through the broker');

    // The agent's own Authorization, whatever it holds, is replaced.
    const own = await e.get('bot-1', cpUrl('/whoami'), { authorization: 'Bearer not-a-control-plane-token' });
    answers.push(JSON.stringify(own));
    t.equal(own.status, 200);
    t.match(JSON.parse(own.text), { subject: 'agent:bot-1', kind: 'agent-operator' });
  });

  t.test('its own audit trail: refused without the auditor grant, then its own records only', async (t) => {
    const refused = await e.get('bot-1', cpUrl('/audit/events'));
    answers.push(JSON.stringify(refused));
    t.equal(refused.status, 403, 'the control plane refuses an agent with no audit grant');
    t.match(JSON.parse(refused.text), { detail: /agent:bot-1 holds no audit grant/ });

    const grant = await e.cph.call('root', 'POST', '/orgs/org-a/grants', { principal: 'agent:bot-1', role: 'auditor' });
    t.equal(grant.status, 201, 'an org admin grants agent:bot-1 the auditor role');
    // bot-2 leaves a trace of its own, which bot-1 must not see.
    await e.get('bot-2', `https://api.dest.test:${e.dest.port}/bot-2-was-here`);
    t.ok(
      await until(async () => (await enclaveAudit('agent_id=bot-2&proto=https')).length > 0, 30_000),
      'bot-2 flow is in the store (the enclave admin sees it)',
    );

    let records: Record<string, unknown>[] = [];
    t.ok(
      await until(async () => {
        const read = await e.get('bot-1', cpUrl('/audit/events?proto=https&limit=100'));
        answers.push(JSON.stringify(read));
        if (read.status !== 200) return false;
        records = JSON.parse(read.text).records;
        return records.some((r) => r.dst_port === Number(e.cpApiHost.split(':')[1]));
      }, 30_000),
      'the agent reads the network_flow records of its own calls to the control plane',
    );
    t.ok(records.length > 0);
    for (const r of records) t.match(r, { agent_id: 'bot-1', org_id: 'org-a', proto: 'https' }, 'its own, flows only');
    const flow = records.find((r) => (r.attrs as Record<string, string>).url?.endsWith('/api/v1/whoami'))!;
    t.match(flow, {
      actor: 'agent:bot-1',
      action: 'http.request',
      dst_host: '127.0.0.1',
      source: 'gateway',
      attrs: { route: 'control-plane', injected_headers: 'authorization', status: '200' },
    });
    t.notMatch((flow.attrs as Record<string, string>).request_headers ?? '', /authorization/i);
    const asked = await e.get('bot-1', cpUrl('/audit/events?agent_id=bot-2'));
    answers.push(JSON.stringify(asked));
    t.equal(asked.status, 200);
    t.same(JSON.parse(asked.text).records, [], 'asking for another agent: nothing');
  });

  t.test('one token for the agent requests within its lifetime; the agent never sees it', async (t) => {
    const before = mints('bot-1').length;
    const agent = await e.agent('bot-1');
    const { request } = await import('undici');
    for (let i = 0; i < 6; i++) {
      const res = await request(cpUrl('/whoami'), { dispatcher: agent });
      t.equal(res.statusCode, 200);
      answers.push(JSON.stringify(res.headers) + (await res.body.text()));
    }
    t.equal(mints('bot-1').length, before, 'no mint for these six: the token is kept');
    const tokens = e.gw.gw.deps.operatorTokens!;
    const token = await tokens.token(identity('bot-1'));
    t.equal(mints('bot-1').length, before, 'the token the gateway holds is the one it presented');
    t.match(token, /^ey[\w-]+\.[\w-]+\.[\w-]+$/);

    for (const text of answers) t.notOk(text.includes(token), 'no answer the agent got holds the token');
    // Every request of bot-1 to the control plane so far carried a token (answered or not): one
    // agent-operator-token.present record each, shipped to the store.
    const requests = answers.length;
    let stored: Record<string, unknown>[] = [];
    const presented = () => stored.filter((r) => r.action === 'agent-operator-token.present' && r.agent_id === 'bot-1');
    t.ok(
      await until(async () => {
        stored = await enclaveAudit('limit=1000');
        return presented().length >= requests;
      }, 30_000),
      'each presentation is an audit_events record',
    );
    t.equal(presented().length, requests, `one per request (${requests})`);
    t.ok(presented().every((r) => r.outcome === 'allow' && r.source === 'gateway' && r.trace_id));
    t.notOk(JSON.stringify(stored).includes(token), 'the token is in no record');
    t.notOk(JSON.stringify(e.gw.logs).includes(token), 'nor in a log line of the gateway');

    // Past its lifetime (less the gateway's margin), the next request mints one new token.
    t.ok(
      await until(
        async () => {
          const res = await request(cpUrl('/whoami'), { dispatcher: agent });
          await res.body.text();
          return mints('bot-1').length === before + 1;
        },
        30_000,
        500,
      ),
      'a new token once the first nears its end',
    );
    t.not(await tokens.token(identity('bot-1')), token, 'renewed');
  });

  t.test('a contained agent: 403 at the mint, nothing reaches the control plane', async (t) => {
    const contain = await e.cph.call('root', 'POST', '/orgs/org-a/agents/bot-2/containment', { contained: true });
    t.equal(contain.status, 200);
    t.ok(
      await until(async () => (await getAgent(e.broker.broker.deps.db, 'bot-2'))?.contained === true),
      'the broker knows (the gateway snapshot does not yet)',
    );
    const relayed = e.cpRelay.bytesUp;
    const refused = await e.get('bot-2', cpUrl('/whoami'));
    t.equal(refused.status, 403);
    t.match(JSON.parse(refused.text), { error: { type: 'permission_error', message: /contained/ } });
    t.equal(e.cpRelay.bytesUp, relayed, 'not a byte toward the control plane');
    t.equal(mints('bot-2').length, 0, 'the control plane minted nothing for it');
    t.match(
      e.broker.audit.find((r) => r.action === 'agent-operator-token.mint' && r.resource === 'agent:bot-2'),
      { outcome: 'deny', reason: /contained/ },
      'the broker refused it, and says so',
    );
    let flow: Record<string, unknown> | undefined;
    t.ok(
      await until(async () => {
        flow = (await enclaveAudit('agent_id=bot-2&proto=https&outcome=deny'))[0];
        return flow !== undefined;
      }, 30_000),
    );
    t.match(flow, { dst_port: Number(e.cpApiHost.split(':')[1]), reason: /agent-operator token refused/ });
  });

  t.test('contained with a token kept: once the snapshot says so, refused at the door', async (t) => {
    const tokens = e.gw.gw.deps.operatorTokens!;
    const kept = await tokens.token(identity('bot-1'));
    const minted = mints('bot-1').length;
    t.equal(await tokens.token(identity('bot-1')), kept, 'bot-1 holds a token in the gateway');
    const contain = await e.cph.call('root', 'POST', '/orgs/org-a/agents/bot-1/containment', { contained: true });
    t.equal(contain.status, 200);
    // What config-pull brings the gateway: the agent contained in its policy snapshot.
    const snapshot = enclaveSnapshot();
    snapshot.agents['bot-1'].contained = true;
    await e.gw.writeSnapshot(snapshot);
    const relayed = e.cpRelay.bytesUp;
    const token = await e.gw.token({ sub: 'bot-1', org_id: 'org-a', agent_name: 'bot-1' });
    const refused = await curl([
      ...viaGateway(e.gw, token),
      '--cacert',
      join(e.dir, 'interception-ca.pem'),
      '-w',
      '%{http_connect}',
      cpUrl('/whoami'),
    ]);
    t.equal(refused.stdout.slice(-3), '403', 'the CONNECT itself is refused');
    t.equal(e.cpRelay.bytesUp, relayed, 'the kept token went nowhere');
    t.equal(mints('bot-1').length, minted, 'nothing minted');
    let refusal: Record<string, unknown> | undefined;
    t.ok(
      await until(async () => {
        // The refused CONNECT, not a tunnel of bot-1's the reload cut ("policy changed: …", answered 200).
        refusal = (await enclaveAudit('agent_id=bot-1&proto=tcp&outcome=deny')).find(
          (r) => (r.attrs as Record<string, unknown> | undefined)?.status === '403',
        );
        return refusal !== undefined;
      }, 30_000),
      'the refused CONNECT is recorded',
    );
    t.match(refusal, { action: 'connect', reason: /contained/, attrs: { status: '403' } });
  });
}
