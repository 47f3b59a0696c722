import tls from 'node:tls';
import t, { type Test } from 'tap';
import { REPLY } from '../../fixtures/llm-upstream.ts';
import { PLATFORM_KEY } from '../../fixtures/llmproxy-harness.ts';
import { tokenIssuer } from '../../fixtures/agent-identity.ts';
import { until } from '../../fixtures/eventually.ts';
import type { DvxServer } from '../../fixtures/dvx-server.ts';
import { interceptFlags, startCliWorld } from './e2e-cli-harness.ts';
import { parseAnswer } from './gateway-harness.ts';

// The command line, end to end: `bin/dvx serve llmproxy` and `bin/dvx serve gateway` as child processes
// (flags as docs/gateway.md gives them) and the machine's curl as the agent, `--proxy https://…
// --proxy-cacert … --proxy-header 'Proxy-Authorization: Bearer …'`: a blind tunnel (--no-http-capture,
// no CA), an intercepted one (--ca-cert/--ca-key; curl trusts the interception CA), a plain http
// request in absolute form, https://api.anthropic.com and https://api.openai.com routed to llmproxy;
// no token (407, Proxy-Authenticate), a refused destination (403 naming the rule's reason). Every
// network_flow line the gateway wrote on its stdout is parsed and checked.

t.setTimeout(110_000);
const w = await startCliWorld();
t.teardown(() => w.close());
const llmproxy = await w.llmproxy();
const intercepting = await w.gateway(interceptFlags(w, llmproxy));
const blind = await w.gateway(['--no-http-capture']);
const token = await w.token();
const securePort = w.secureEcho.port;
const plainPort = w.plainEcho.port;

/** What every record of an agent-1 attempt carries, whatever the attempt. */
function checkRecord(t: Test, flow: Record<string, unknown>): void {
  t.match(flow, {
    stream: 'audit',
    table: 'network_flow',
    id: /^\S+$/,
    event_time: /^\d{4}-\d\d-\d\dT/,
    kind: 'network_flow',
    source: 'gateway',
    actor: 'agent:agent-1',
    actor_kind: 'agent',
    agent_id: 'agent-1',
    agent_name: 'builder',
    org_id: 'org-1',
    group_id: 'g-1',
    enclave_id: 'enc-cli',
    enclave_name: 'cli-enclave',
    identified: true,
    src: /^127\.0\.0\.1:\d+$/,
    src_ip: '127.0.0.1',
    attrs: { started_at: /^\d{4}-/, bytes_up: /^\d+$/, bytes_down: /^\d+$/, duration_ms: /^\d/ },
  });
}

/** Records written by `gw` after the first `from`, once `n` have arrived. */
async function newFlows(gw: DvxServer, from: number, n: number): Promise<Record<string, unknown>[]> {
  return (await w.flowsUntil(gw, (fs) => fs.length >= from + n)).slice(from);
}

const attrsOf = (f: Record<string, unknown> | undefined) => (f?.attrs ?? {}) as Record<string, string>;

t.test('a blind CONNECT tunnel (--no-http-capture, no CA) to an https upstream', async (t) => {
  t.setTimeout(30_000);
  const before = blind.records('network_flow').length;
  const r = await w.curlVia(blind, token, [
    '-v',
    '--cacert',
    w.file('ca.pem'),
    '--data-binary',
    'hello blind',
    `https://127.0.0.1:${securePort}/blind?x=1`,
  ]);
  t.equal(r.code, 0, r.stderr);
  t.same(JSON.parse(r.stdout), { echo: true, method: 'POST', url: '/blind?x=1', body: 'hello blind' });
  t.match(r.stderr, /Server certificate:[\s\S]*issuer: CN=e2e cli CA\n/, "the upstream's own certificate");
  t.notOk('proxy-authorization' in w.secureEcho.seen.at(-1)!.headers, 'Proxy-Authorization stops at the gateway');
  // Blind: the certificate curl checked is the upstream's; the interception CA vouches for nothing here.
  const pinned = await w.curlVia(blind, token, [
    '-v',
    '--cacert',
    w.interceptCaFile,
    `https://127.0.0.1:${securePort}/`,
  ]);
  t.not(pinned.code, 0);
  t.match(pinned.stderr, /CONNECT tunnel established, response 200[\s\S]*TLS alert, unknown CA/, 'refused by curl');

  const [flow] = await newFlows(blind, before, 1);
  checkRecord(t, flow);
  t.match(flow, {
    action: 'connect',
    proto: 'tcp',
    dst: `127.0.0.1:${securePort}`,
    dst_host: '127.0.0.1',
    dst_ip: '127.0.0.1',
    dst_port: securePort,
    outcome: 'allow',
    attrs: { status: '200' },
  });
  const attrs = attrsOf(flow);
  t.ok(Number(attrs.bytes_up) > 'hello blind'.length, `TLS bytes up (${attrs.bytes_up})`);
  t.ok(Number(attrs.bytes_down) > 0, `TLS bytes down (${attrs.bytes_down})`);
  t.notOk(attrs.intercepted === 'true', 'not intercepted');
  for (const key of ['request_body', 'response_body', 'method', 'url'])
    t.notOk(key in attrs, `${key}: nothing seen inside`);
});

t.test('an intercepted CONNECT tunnel (--ca-cert/--ca-key): curl trusts the interception CA', async (t) => {
  t.setTimeout(30_000);
  const before = intercepting.records('network_flow').length;
  const r = await w.curlVia(intercepting, token, [
    '-v',
    '--cacert',
    w.interceptCaFile,
    '--data-binary',
    'hello intercepted',
    `https://127.0.0.1:${securePort}/intercepted`,
  ]);
  t.equal(r.code, 0, r.stderr);
  t.same(JSON.parse(r.stdout), { echo: true, method: 'POST', url: '/intercepted', body: 'hello intercepted' });
  t.match(
    r.stderr,
    /Server certificate:[\s\S]*subjectAltName: host "127\.0\.0\.1" matched[\s\S]*issuer: CN=e2e cli interception CA\n/,
    'a leaf of the interception CA',
  );

  const flows = await newFlows(intercepting, before, 2);
  for (const f of flows) checkRecord(t, f);
  const request = flows.find((f) => f.proto === 'https');
  const tunnel = flows.find((f) => f.proto === 'tcp');
  t.match(request, {
    action: 'http.request',
    dst: `127.0.0.1:${securePort}`,
    dst_host: '127.0.0.1',
    dst_ip: '127.0.0.1',
    dst_port: securePort,
    outcome: 'allow',
    attrs: {
      method: 'POST',
      url: `https://127.0.0.1:${securePort}/intercepted`,
      status: '200',
      route: 'destination',
      request_body: 'hello intercepted',
      bytes_up: String('hello intercepted'.length),
    },
  });
  t.match(JSON.parse(attrsOf(request).response_body), { url: '/intercepted' });
  t.equal(attrsOf(request).bytes_down, String(Buffer.byteLength(r.stdout)));
  t.match(tunnel, {
    action: 'connect',
    dst: `127.0.0.1:${securePort}`,
    outcome: 'allow',
    attrs: { status: '200', intercepted: 'true', requests: '1', bytes_up: attrsOf(request).bytes_up },
  });

  // Trusting only the upstream's CA, curl refuses the gateway's leaf: the tunnel was terminated.
  const beforeUntrusting = intercepting.records('network_flow').length;
  const untrusting = await w.curlVia(intercepting, token, [
    '-v',
    '--cacert',
    w.file('ca.pem'),
    `https://127.0.0.1:${securePort}/`,
  ]);
  t.not(untrusting.code, 0);
  t.match(untrusting.stderr, /CONNECT tunnel established, response 200[\s\S]*TLS alert, unknown CA/, 'refused by curl');
  // Its tunnel is recorded too, once the gateway sees it end: waited for here, so it is not taken for the
  // next test's record.
  const [refusedTunnel] = await newFlows(intercepting, beforeUntrusting, 1);
  t.match(refusedTunnel, { action: 'connect', dst: `127.0.0.1:${securePort}`, attrs: { intercepted: 'true' } });
});

t.test('a plain http request in absolute form', async (t) => {
  t.setTimeout(30_000);
  const before = intercepting.records('network_flow').length;
  const r = await w.curlVia(intercepting, token, [
    '--data-binary',
    'hello plain',
    `http://127.0.0.1:${plainPort}/plain?q=1`,
  ]);
  t.equal(r.code, 0, r.stderr);
  t.same(JSON.parse(r.stdout), { echo: true, method: 'POST', url: '/plain?q=1', body: 'hello plain' });
  const seen = w.plainEcho.seen.at(-1)!;
  t.equal(seen.url, '/plain?q=1', 'the upstream gets origin form');
  t.notOk('proxy-authorization' in seen.headers, 'Proxy-Authorization stops at the gateway');
  const [flow] = await newFlows(intercepting, before, 1);
  checkRecord(t, flow);
  t.match(flow, {
    action: 'http.request',
    proto: 'http',
    dst: `127.0.0.1:${plainPort}`,
    dst_host: '127.0.0.1',
    dst_ip: '127.0.0.1',
    dst_port: plainPort,
    outcome: 'allow',
    attrs: {
      method: 'POST',
      url: `http://127.0.0.1:${plainPort}/plain?q=1`,
      status: '200',
      bytes_up: '11',
      bytes_down: String(Buffer.byteLength(r.stdout)),
    },
  });
});

t.test('https://api.anthropic.com and https://api.openai.com: CONNECT, routed to llmproxy, 200', async (t) => {
  t.setTimeout(40_000);
  const before = intercepting.records('network_flow').length;
  const llmBefore = llmproxy.records('llm_audit_log').length;
  const anthropic = (body: string) =>
    w.curlVia(intercepting, token, [
      '--cacert',
      w.interceptCaFile,
      '-H',
      'x-api-key: sk-ant-agent-dummy',
      '-H',
      'anthropic-version: 2023-06-01',
      '-H',
      'content-type: application/json',
      '--data-binary',
      body,
      'https://api.anthropic.com/v1/messages',
    ]);
  const plain = await anthropic(
    JSON.stringify({ model: 'claude-cli', max_tokens: 8, messages: [{ role: 'user', content: 'curl plain' }] }),
  );
  t.equal(plain.code, 0, plain.stderr);
  t.match(JSON.parse(plain.stdout), { type: 'message', content: [{ type: 'text', text: REPLY }] });
  t.equal(w.llmUpstream.received.at(-1)!.headers['x-api-key'], PLATFORM_KEY, "llmproxy's key, not the agent's");

  const streamed = await anthropic(
    JSON.stringify({
      model: 'claude-cli',
      max_tokens: 8,
      stream: true,
      messages: [{ role: 'user', content: 'curl stream' }],
    }),
  );
  t.equal(streamed.code, 0, streamed.stderr);
  t.match(streamed.stdout, /^event: message_start\n/);
  t.match(streamed.stdout, /event: message_stop\n/);

  const chat = await w.curlVia(intercepting, token, [
    '--cacert',
    w.interceptCaFile,
    '-H',
    'authorization: Bearer sk-agent-dummy',
    '-H',
    'content-type: application/json',
    '--data-binary',
    JSON.stringify({ model: 'gpt-cli', messages: [{ role: 'user', content: 'curl chat' }] }),
    'https://api.openai.com/v1/chat/completions',
  ]);
  t.equal(chat.code, 0, chat.stderr);
  t.match(JSON.parse(chat.stdout), { choices: [{ message: { content: REPLY } }] });

  // Plain http:// to the provider's host, in absolute form: routed to llmproxy all the same.
  const viaHttp = await w.curlVia(intercepting, token, [
    '-H',
    'x-api-key: sk-ant-agent-dummy',
    '-H',
    'content-type: application/json',
    '--data-binary',
    JSON.stringify({ model: 'claude-cli', max_tokens: 8, messages: [{ role: 'user', content: 'curl http' }] }),
    'http://api.anthropic.com/v1/messages',
  ]);
  t.equal(viaHttp.code, 0, viaHttp.stderr);
  t.match(JSON.parse(viaHttp.stdout), { content: [{ type: 'text', text: REPLY }] });

  t.ok(await until(() => llmproxy.records('llm_audit_log').length >= llmBefore + 4), "llmproxy's four records");
  t.match(llmproxy.records('llm_audit_log').slice(llmBefore), [
    { agent_id: 'agent-1', org_id: 'org-1', path: '/v1/messages', status: 200, decision: 'allow' },
    { agent_id: 'agent-1', org_id: 'org-1', path: '/v1/messages', status: 200, decision: 'allow' },
    { agent_id: 'agent-1', org_id: 'org-1', path: '/v1/chat/completions', status: 200, decision: 'allow' },
    { agent_id: 'agent-1', org_id: 'org-1', path: '/v1/messages', status: 200, decision: 'allow' },
  ]);

  // Three requests in three tunnels (curl opens one per run), and one in absolute form.
  const flows = await newFlows(intercepting, before, 7);
  t.match(
    flows.find((f) => f.proto === 'http'),
    {
      action: 'http.request',
      dst: 'api.anthropic.com:80',
      dst_ip: '',
      outcome: 'allow',
      attrs: { route: 'llmproxy', url: 'http://api.anthropic.com:80/v1/messages', status: '200' },
    },
  );
  for (const f of flows) checkRecord(t, f);
  const requests = flows.filter((f) => f.proto === 'https');
  t.equal(requests.length, 3);
  for (const [f, host, path] of [
    [requests[0], 'api.anthropic.com', '/v1/messages'],
    [requests[1], 'api.anthropic.com', '/v1/messages'],
    [requests[2], 'api.openai.com', '/v1/chat/completions'],
  ] as [Record<string, unknown>, string, string][])
    t.match(f, {
      action: 'http.request',
      dst: `${host}:443`,
      dst_host: host,
      dst_port: 443,
      dst_ip: '',
      outcome: 'allow',
      attrs: { route: 'llmproxy', method: 'POST', url: `https://${host}:443${path}`, status: '200' },
    });
  const tunnels = flows.filter((f) => f.proto === 'tcp');
  t.equal(tunnels.length, 3);
  for (const f of tunnels)
    t.match(f, { action: 'connect', dst_port: 443, attrs: { intercepted: 'true', requests: '1' } });
  t.notMatch(JSON.stringify(flows), /sk-ant-agent-dummy|sk-agent-dummy/, "the agent's keys are in no record");
});

t.test('no token, or a token the gateway cannot verify: 407 with Proxy-Authenticate, nothing recorded', async (t) => {
  t.setTimeout(30_000);
  const before = intercepting.records('network_flow').length;
  const llmBefore = llmproxy.records('llm_audit_log').length;
  const stranger = await (await tokenIssuer()).mint();
  for (const [name, who] of [
    ['no token', null],
    ['a token of another issuer', stranger],
  ] as [string, string | null][]) {
    const connect = await w.curlVia(intercepting, who, [
      '-D',
      '-',
      '--cacert',
      w.interceptCaFile,
      'https://api.anthropic.com/v1/messages',
    ]);
    t.equal(connect.code, 56, `${name}: curl's CONNECT failed`);
    t.match(connect.stderr, /CONNECT tunnel failed, response 407/);
    t.match(connect.stdout, /^HTTP\/1\.1 407 Proxy Authentication Required\r\n/);
    t.match(connect.stdout, /\r\nproxy-authenticate: Bearer realm="dvx-gateway"\r\n/i);

    const absolute = await w.curlVia(intercepting, who, ['-D', '-', `http://127.0.0.1:${plainPort}/no-token`]);
    const answer = parseAnswer(absolute.stdout);
    t.equal(answer.status, 407, `${name}: absolute form`);
    t.equal(answer.headers['proxy-authenticate'], 'Bearer realm="dvx-gateway"');
    t.match(JSON.parse(answer.body), { type: 'error', error: { type: 'authentication_error' } });
  }
  t.notOk(
    w.plainEcho.seen.some((s) => s.url === '/no-token'),
    'nothing reached the upstream',
  );
  t.equal(llmproxy.records('llm_audit_log').length, llmBefore, 'nor llmproxy');
  t.equal(intercepting.records('network_flow').length, before, "a stranger's attempts are in no org's audit");
});

t.test('a refused destination: 403 naming the rule’s reason, recorded deny; a suspended agent: 403', async (t) => {
  t.setTimeout(30_000);
  const before = intercepting.records('network_flow').length;
  const absolute = await w.curlVia(intercepting, token, ['-D', '-', 'http://blocked.test/leak?d=1']);
  const answer = parseAnswer(absolute.stdout);
  t.equal(answer.status, 403);
  t.same(JSON.parse(answer.body), {
    type: 'error',
    error: { type: 'destination_denied', message: 'destination refused: no exfiltration, ever' },
  });

  const connect = await w.curlVia(intercepting, token, ['-w', '%{http_connect}', 'https://blocked.test/leak']);
  t.equal(connect.code, 56);
  t.equal(connect.stdout, '403');
  // curl does not show a refused CONNECT's body: read it on the wire.
  const raw = await new Promise<string>((resolve, reject) => {
    let got = '';
    const socket = tls.connect(
      { host: '127.0.0.1', port: intercepting.port, ca: w.ca.certPem, servername: 'localhost' },
      () =>
        socket.write(
          `CONNECT blocked.test:443 HTTP/1.1\r\nHost: blocked.test:443\r\nProxy-Authorization: Bearer ${token}\r\n\r\n`,
        ),
    );
    socket.setTimeout(10_000, () => socket.destroy());
    socket.on('data', (d: Buffer) => (got += d.toString('latin1')));
    socket.on('error', reject);
    socket.on('close', () => resolve(got));
  });
  const refused = parseAnswer(raw);
  t.equal(refused.status, 403);
  t.match(JSON.parse(refused.body), { error: { type: 'destination_denied', message: /no exfiltration, ever/ } });

  const suspended = await w.curlVia(intercepting, await w.token({ sub: 'agent-s', agent_name: 'held' }), [
    '-D',
    '-',
    `http://127.0.0.1:${plainPort}/suspended`,
  ]);
  const held = parseAnswer(suspended.stdout);
  t.equal(held.status, 403);
  t.match(JSON.parse(held.body), { error: { type: 'permission_error' } });
  t.notOk(
    w.plainEcho.seen.some((s) => s.url === '/suspended'),
    'nothing reached the upstream',
  );

  const flows = await newFlows(intercepting, before, 4);
  for (const f of flows.slice(0, 3)) {
    checkRecord(t, f);
    t.match(f, {
      dst_host: 'blocked.test',
      dst_ip: '',
      outcome: 'deny',
      reason: 'no exfiltration, ever',
      attrs: { status: '403', bytes_up: '0', bytes_down: '0' },
    });
  }
  t.match(flows[0], {
    proto: 'http',
    action: 'http.request',
    dst: 'blocked.test:80',
    attrs: { url: 'http://blocked.test/leak?d=1' },
  });
  t.match(flows[1], { proto: 'tcp', action: 'connect', dst: 'blocked.test:443' });
  t.match(flows[3], {
    proto: 'http',
    agent_id: 'agent-s',
    agent_name: 'held',
    org_id: 'org-1',
    outcome: 'deny',
    reason: 'agent is suspended',
    attrs: { status: '403' },
  });
});

t.test('SIGTERM: the gateway and llmproxy stop cleanly', async (t) => {
  t.setTimeout(30_000);
  t.equal(await intercepting.stop(), 0);
  t.ok(intercepting.lines.some((l) => l.msg === 'gateway stopped'));
  t.equal(await blind.stop(), 0);
  t.equal(await llmproxy.stop(), 0);
});
