import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import t from 'tap';
import { generateCa } from '../../../core/tls.ts';
import {
  agentCertificate,
  baseSnapshot,
  curl,
  startGatewayHarness,
  startHttps,
  viaGateway,
} from './gateway-harness.ts';

// Who an attempt is, and whether that agent may go out at all: an identity certificate over mTLS
// (--agent-ca) as the alternative to a token, a bad token never rescued by a good certificate, and the
// agent's standing in the snapshot (suspended, contained, another org) refusing with 403, recorded.

const h = await startGatewayHarness({ agentCa: true });
t.teardown(() => h.close());
const dest = await startHttps(h.ca);
t.teardown(() => dest.close());
const url = `https://127.0.0.1:${dest.port}/`;

async function certFiles(name: string, pem: { certPem: string; keyPem: string }): Promise<string[]> {
  const cert = join(h.dir, `${name}.pem`);
  const key = join(h.dir, `${name}-key.pem`);
  await writeFile(cert, pem.certPem);
  await writeFile(key, pem.keyPem);
  return ['--proxy-cert', cert, '--proxy-key', key];
}

/** curl's CONNECT status through the gateway (200 when the tunnel opened). */
async function connectStatus(args: string[]): Promise<string> {
  const r = await curl([...args, '-o', '/dev/null', '-w', '%{http_connect}', '--cacert', h.caFile, url]);
  return r.stdout;
}

t.test('an identity certificate is a way in; a bad token is not rescued by it', async (t) => {
  const cert = await certFiles(
    'agent-1',
    await agentCertificate(h.ca, { agent: 'agent-1', org: 'org-1', group: 'g-1' }),
  );
  const before = h.audit.length;
  t.equal(await connectStatus([...viaGateway(h), ...cert]), '200');
  const [flow] = await h.flowsAfter(before);
  t.match(flow, { agent_id: 'agent-1', org_id: 'org-1', group_id: 'g-1', agent_name: 'builder', identified: true });
  t.equal(await connectStatus([...viaGateway(h, 'eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln'), ...cert]), '407');

  const stranger = await generateCa('not the agent CA');
  const foreign = await certFiles('foreign', await agentCertificate(stranger, { agent: 'agent-1', org: 'org-1' }));
  t.equal(await connectStatus([...viaGateway(h), ...foreign]), '407', 'a certificate of another CA is no identity');
  const noOrg = await certFiles('no-org', await agentCertificate(h.ca, { agent: 'agent-1', org: '' }));
  t.equal(await connectStatus([...viaGateway(h), ...noOrg]), '407', 'nor one without an org');
});

t.test('suspended, contained and another org’s agents: 403, recorded', async (t) => {
  for (const [who, reason, org] of [
    [{ sub: 'agent-s' }, 'agent is suspended', 'org-1'],
    [{ sub: 'agent-c' }, 'agent is contained', 'org-1'],
    [
      { sub: 'agent-1', org_id: 'org-2' },
      'token org_id "org-2" differs from the agent\'s org in the snapshot',
      'org-1',
    ],
  ] as [Record<string, unknown>, string, string][]) {
    const before = h.audit.length;
    const r = await curl([...viaGateway(h, await h.token(who)), '-o', '/dev/null', '-w', '%{http_connect}', url]);
    t.equal(r.stdout, '403', reason);
    const [flow] = await h.flowsAfter(before);
    t.match(flow, { agent_id: who.sub, org_id: org, outcome: 'deny', reason, attrs: { status: '403' } });
  }
  const contained = await certFiles('agent-c', await agentCertificate(h.ca, { agent: 'agent-c', org: 'org-1' }));
  t.equal(await connectStatus([...viaGateway(h), ...contained]), '403', 'by certificate too');
});

t.test('a suspension in a reloaded snapshot applies to the next attempt', async (t) => {
  const token = await h.token();
  t.equal(await connectStatus(viaGateway(h, token)), '200');
  const suspended = baseSnapshot();
  suspended.agents['agent-1'].status = 'suspended';
  await h.writeSnapshot(suspended);
  t.teardown(() => h.writeSnapshot(baseSnapshot()));
  t.equal(await connectStatus(viaGateway(h, token)), '403');
});
