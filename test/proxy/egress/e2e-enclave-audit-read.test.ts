import t from 'tap';
import { until } from '../../fixtures/eventually.ts';
import { startEnclave } from './e2e-enclave-plane.ts';
import { curl, viaGateway } from './gateway-harness.ts';

// P11 end to end: network_flow records read through the audit APIs. The gateway's --audit-dsn and
// --audit-wal-dir ship its records (network_flow, and the audit_events of what it presented) into the
// PostgreSQL store the enclave broker's audit read API reads, and the control plane's too. An
// enclave-local admin finds the agent's flows with the `proto` and `dst_host` filters (which match
// flows only); an org member without audit:read:all sees none of them, on either plane; the platform
// operator's view of the control plane holds no enclave's flows.

t.setTimeout(180_000);

const e = await startEnclave({ denyDest: ['host=blocked.dest.test,reason=not from this enclave'] });
if (!e) {
  t.comment('no PostgreSQL at 127.0.0.1:5432: the enclave end-to-end tests need one');
} else {
  t.teardown(() => e.close());
  type Rec = Record<string, unknown> & { attrs: Record<string, string> };
  const brokerRead = async (persona: string, query: string) => {
    const res = await e.broker.operator(persona, 'GET', `/api/v1/audit/events?${query}`);
    return { status: res.status, records: (res.body?.records ?? []) as Rec[], body: res.body };
  };
  const cpRead = async (persona: string, query: string) => {
    const res = await e.cph.call(persona, 'GET', `/audit/events?${query}`);
    return { status: res.status, records: (res.body?.records ?? []) as Rec[], body: res.body };
  };
  const destHost = 'api.dest.test';

  t.test('the agent makes flows: a tunnel with requests inside, a refused CONNECT, a control plane call', async (t) => {
    for (const path of ['/one', '/two']) {
      const res = await e.get('bot-1', `https://${destHost}:${e.dest.port}${path}`);
      t.equal(res.status, 200, path);
    }
    const token = await e.gw.token({ sub: 'bot-1', org_id: 'org-a', agent_name: 'bot-1' });
    const denied = await curl([...viaGateway(e.gw, token), '-w', '%{http_connect}', 'https://blocked.dest.test/']);
    t.equal(denied.stdout, '403');
    t.equal((await e.get('bot-1', `https://${e.cpApiHost}/api/v1/whoami`)).status, 200);

    // Four flows of api.dest.test (two tunnels, two requests), one refusal, and the control plane's.
    t.ok(
      await until(async () => (await brokerRead('admin-a', 'agent_id=bot-1&limit=100')).records.length >= 8, 30_000),
      'shipped to the store and read back by the enclave admin',
    );
  });

  t.test('the broker: proto and dst_host find the flows, and only flows', async (t) => {
    const all = await brokerRead('admin-a', 'agent_id=bot-1&limit=100');
    t.equal(all.status, 200);
    t.ok(
      all.records.some((r) => r.action === 'agent-operator-token.present'),
      'unfiltered, the agent trail holds more than flows',
    );

    const tunnels = await brokerRead('admin-a', `proto=tcp&dst_host=${destHost}`);
    t.equal(tunnels.status, 200);
    t.equal(tunnels.records.length, 2, 'the two tunnels');
    for (const r of tunnels.records)
      t.match(r, {
        action: 'connect',
        actor: 'agent:bot-1',
        actor_kind: 'agent',
        agent_id: 'bot-1',
        agent_name: 'bot-1',
        org_id: 'org-a',
        enclave_id: 'enc-test',
        identified: true,
        proto: 'tcp',
        dst: `${destHost}:${e.dest.port}`,
        dst_host: destHost,
        dst_ip: '127.0.0.1',
        dst_port: e.dest.port,
        src_ip: '127.0.0.1',
        outcome: 'allow',
        source: 'gateway',
        // Inside an intercepted tunnel bytes are its requests' bodies: a GET sends none, gets some.
        attrs: { status: '200', intercepted: 'true', requests: '1', bytes_up: '0', bytes_down: /^[1-9]/ },
      });

    const requests = await brokerRead('admin-a', `proto=https&dst_host=${destHost}`);
    t.same(requests.records.map((r) => r.attrs.url).sort(), [
      `https://${destHost}:${e.dest.port}/one`,
      `https://${destHost}:${e.dest.port}/two`,
    ]);
    for (const r of requests.records)
      t.match(r, { action: 'http.request', proto: 'https', attrs: { method: 'GET', status: '200' } });

    const refused = await brokerRead('admin-a', 'dst_host=blocked.dest.test');
    t.equal(refused.records.length, 1);
    t.match(refused.records[0], {
      action: 'connect',
      proto: 'tcp',
      outcome: 'deny',
      reason: 'not from this enclave',
      dst_port: 443,
      attrs: { status: '403' },
    });

    const flowsOnly = await brokerRead('admin-a', 'proto=https&limit=100');
    t.ok(flowsOnly.records.length >= 3);
    t.ok(
      flowsOnly.records.every((r) => r.action === 'http.request' && r.proto === 'https' && r.source === 'gateway'),
      'a proto filter matches network_flow rows only',
    );
    t.same((await brokerRead('admin-a', 'dst_host=nowhere.test')).records, [], 'a host no flow went to');
    t.same((await brokerRead('admin-a', `proto=udp&dst_host=${destHost}`)).records, []);
  });

  t.test('a member of the org without audit:read:all sees none of the agent flows', async (t) => {
    const before = await brokerRead('bob', 'proto=tcp');
    t.equal(before.status, 403, 'no enclave-local grant: refused');
    const grant = await e.broker.operator('admin-a', 'POST', '/api/v1/grants', {
      principal: 'user:bob',
      role: 'member',
    });
    t.equal(grant.status, 201);
    const filtered = await brokerRead('bob', `proto=tcp&dst_host=${destHost}`);
    t.equal(filtered.status, 200);
    t.same(filtered.records, [], 'with the filters: nothing');
    const everything = await brokerRead('bob', 'limit=1000');
    t.equal(everything.status, 200);
    t.notOk(
      everything.records.some((r) => r.agent_id === 'bot-1' || r.proto),
      'nor anything of the agent unfiltered',
    );
    t.same((await brokerRead('bob', 'agent_id=bot-1')).records, [], 'nor by asking for the agent');
  });

  t.test('the control plane reads the same store under its own grants', async (t) => {
    const alice = await cpRead('alice', `proto=tcp&dst_host=${destHost}`);
    t.equal(alice.status, 200, JSON.stringify(alice.body));
    t.equal(alice.records.length, 2, 'the org auditor finds the tunnels');
    for (const r of alice.records)
      t.match(r, { agent_id: 'bot-1', proto: 'tcp', dst_host: destHost, outcome: 'allow' });
    const https = await cpRead('alice', `proto=https&dst_host=${destHost}`);
    t.equal(https.records.length, 2, 'and the requests');

    t.equal((await cpRead('bob', 'proto=tcp')).status, 403, 'a member of the org, on the control plane: no audit read');
    const grant = await e.cph.call('root', 'POST', '/orgs/org-a/grants', {
      principal: 'user:bob',
      capability: 'audit:read',
    });
    t.equal(grant.status, 201, 'audit:read, not audit:read:all');
    const bob = await cpRead('bob', `proto=tcp&dst_host=${destHost}`);
    t.equal(bob.status, 200);
    t.same(bob.records, [], 'a member of the org: none');
    const bobAll = await cpRead('bob', 'limit=1000');
    t.notOk(
      bobAll.records.some((r) => r.agent_id === 'bot-1'),
      'nor unfiltered',
    );

    const root = await cpRead('root', `proto=tcp&dst_host=${destHost}&org=org-a`);
    t.equal(root.status, 200);
    t.same(root.records, [], 'the platform operator reads no enclave flows');
  });
}
