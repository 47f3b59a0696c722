import t from 'tap';
import { AGENT_SECRET } from '../../fixtures/llmproxy-harness.ts';
import { REPLY } from '../../fixtures/llm-upstream.ts';
import { until } from '../../fixtures/eventually.ts';
import type { DvxServer } from '../../fixtures/dvx-server.ts';
import { interceptFlags, startCliWorld } from './e2e-cli-harness.ts';

// Capture on and off through the command line: `bin/dvx serve gateway` with the interception CA and
// `--http-capture-max-body 32` records each request's and response's plaintext up to 32 bytes (flagged
// when cut, redacted before the cut) and inspects what it captures; `--no-http-capture` records no
// body nor header: tunnels pass blind, the LLM hosts are still terminated and routed to llmproxy, which
// still governs them. `--http-capture-max-body 0` is the 16 KiB default.

t.setTimeout(110_000);
const w = await startCliWorld();
t.teardown(() => w.close());
const llmproxy = await w.llmproxy();
const LIMIT = 32;
const on = await w.gateway([...interceptFlags(w, llmproxy), '--http-capture-max-body', String(LIMIT)]);
const off = await w.gateway([...interceptFlags(w, llmproxy), '--no-http-capture']);
const token = await w.token();
const secureUrl = `https://127.0.0.1:${w.secureEcho.port}`;
const plainUrl = `http://127.0.0.1:${w.plainEcho.port}`;
const CAPTURE_KEYS = [
  'request_body',
  'response_body',
  'request_headers',
  'response_headers',
  'request_truncated',
  'response_truncated',
];

type Flow = Record<string, unknown> & { attrs: Record<string, string> };

/** The request record of `gw` whose url ends with `path`. */
async function requestFlow(gw: DvxServer, path: string): Promise<Flow> {
  const has = (f: Record<string, unknown>) =>
    String((f.attrs as Record<string, string>).url ?? '').endsWith(path) && f.action === 'http.request';
  return (await w.flowsUntil(gw, (fs) => fs.some(has))).find(has) as Flow;
}

const post = (gw: DvxServer, url: string, body: string, ca = w.interceptCaFile) =>
  w.curlVia(gw, token, ['--cacert', ca, '--data-binary', body, url]);

t.test('capture on: bodies recorded up to --http-capture-max-body, the cut flagged', async (t) => {
  t.setTimeout(30_000);
  // A short request: whole; its echo (longer than the limit): cut.
  const small = await post(on, `${secureUrl}/small`, 'tiny');
  t.equal(small.code, 0, small.stderr);
  const smallFlow = await requestFlow(on, '/small');
  t.match(smallFlow, { proto: 'https', outcome: 'allow', attrs: { status: '200', route: 'destination' } });
  t.equal(smallFlow.attrs.request_body, 'tiny');
  t.equal(smallFlow.attrs.request_truncated, 'false');
  t.equal(smallFlow.attrs.response_body, small.stdout.slice(0, LIMIT), 'the first 32 bytes of the answer');
  t.equal(smallFlow.attrs.response_truncated, 'true');
  t.equal(smallFlow.attrs.response_body_bytes, String(Buffer.byteLength(small.stdout)), 'the whole size, counted');
  t.match(JSON.parse(smallFlow.attrs.request_headers), { 'user-agent': /^curl\// });
  t.notOk('proxy-authorization' in JSON.parse(smallFlow.attrs.request_headers));
  t.match(JSON.parse(smallFlow.attrs.response_headers), { 'content-type': 'application/json' });

  // A long request: cut, flagged, counted whole; the upstream got all of it.
  const long = `${'0123456789'.repeat(10)}-the-end`;
  const big = await post(on, `${secureUrl}/big`, long);
  t.equal(big.code, 0, big.stderr);
  t.equal(w.secureEcho.seen.at(-1)!.body, long, 'the upstream got the whole body');
  const bigFlow = await requestFlow(on, '/big');
  t.equal(bigFlow.attrs.request_body, long.slice(0, LIMIT));
  t.equal(bigFlow.attrs.request_truncated, 'true');
  t.equal(bigFlow.attrs.request_body_bytes, String(long.length));
  t.equal(bigFlow.attrs.bytes_up, String(long.length));

  // Plain http in absolute form: captured the same way.
  const plain = await post(on, `${plainUrl}/plain-captured`, long);
  t.equal(plain.code, 0, plain.stderr);
  const plainFlow = await requestFlow(on, '/plain-captured');
  t.match(plainFlow, { proto: 'http', attrs: { request_body: long.slice(0, LIMIT), request_truncated: 'true' } });

  // The LLM host: the captured call and answer, cut at the limit.
  const call = JSON.stringify({ model: 'claude-cli', max_tokens: 8, messages: [{ role: 'user', content: 'capture' }] });
  const llm = await w.curlVia(on, token, [
    '--cacert',
    w.interceptCaFile,
    '-H',
    'content-type: application/json',
    '-H',
    'x-api-key: sk-ant-agent-dummy',
    '--data-binary',
    call,
    'https://api.anthropic.com/v1/messages',
  ]);
  t.equal(llm.code, 0, llm.stderr);
  t.match(JSON.parse(llm.stdout), { content: [{ text: REPLY }] });
  const llmFlow = await requestFlow(on, 'api.anthropic.com:443/v1/messages');
  t.match(llmFlow, {
    attrs: {
      route: 'llmproxy',
      request_body: call.slice(0, LIMIT),
      request_truncated: 'true',
      response_body: llm.stdout.slice(0, LIMIT),
      response_truncated: 'true',
    },
  });
});

t.test('capture on: a secret in a body is inspected (403) and redacted before the cut', async (t) => {
  t.setTimeout(30_000);
  // The secret starts at byte 20 and straddles the 32-byte cut.
  const body = `password for prod = ${AGENT_SECRET} (do not share)`;
  const seenBefore = w.secureEcho.seen.length;
  const r = await w.curlVia(on, token, [
    '-D',
    '-',
    '--cacert',
    w.interceptCaFile,
    '--data-binary',
    body,
    `${secureUrl}/leak`,
  ]);
  t.match(
    r.stdout,
    /^HTTP\/1\.1 200 Connection Established\r\n\r\nHTTP\/1\.1 403 Forbidden\r\n/,
    'refused inside the tunnel',
  );
  t.match(r.stdout, /"type":"content_policy_violation"/);
  t.equal(w.secureEcho.seen.length, seenBefore, 'nothing reached the upstream');
  const flow = await requestFlow(on, '/leak');
  t.match(flow, { outcome: 'deny', attrs: { status: '403', request_truncated: 'true' } });
  const redacted = body.replace(AGENT_SECRET, '[REDACTED]');
  t.equal(flow.attrs.request_body, redacted.slice(0, LIMIT), 'redacted, then cut');
  t.notMatch(flow.attrs.request_body, /hunt/, 'no prefix of the secret in the captured body');
  // The finding names its match by four characters (docs/gateway.md), never more.
  t.notMatch(JSON.stringify(flow), AGENT_SECRET.slice(0, 5));
  t.match(flow.attrs.findings, /"secrets"/);
});

t.test(
  'capture off (--no-http-capture): no body, no header recorded; the LLM hosts still routed and governed',
  async (t) => {
    t.setTimeout(30_000);
    const before = off.records('network_flow').length;
    // An https destination: blind, curl checks the upstream's own certificate.
    const blind = await post(off, `${secureUrl}/uncaptured`, 'not recorded', w.file('ca.pem'));
    t.equal(blind.code, 0, blind.stderr);
    t.match(JSON.parse(blind.stdout), { url: '/uncaptured', body: 'not recorded' });
    const [tunnel] = await w.flowsUntil(off, (fs) => fs.length > before).then((fs) => fs.slice(before));
    t.match(tunnel, { proto: 'tcp', action: 'connect', dst: `127.0.0.1:${w.secureEcho.port}`, outcome: 'allow' });
    t.notOk((tunnel.attrs as Record<string, string>).intercepted === 'true', 'blind');

    // Plain http: forwarded and recorded, nothing captured.
    const plain = await post(off, `${plainUrl}/plain-uncaptured`, 'not recorded either');
    t.equal(plain.code, 0, plain.stderr);
    const plainFlow = await requestFlow(off, '/plain-uncaptured');
    t.match(plainFlow, { proto: 'http', outcome: 'allow', attrs: { status: '200', method: 'POST' } });
    for (const key of CAPTURE_KEYS) t.notOk(key in plainFlow.attrs, `plain http: no ${key}`);

    // api.anthropic.com: still terminated and routed to llmproxy, nothing captured by the gateway…
    const call = JSON.stringify({
      model: 'claude-cli',
      max_tokens: 8,
      messages: [{ role: 'user', content: 'uncaptured' }],
    });
    const llm = await w.curlVia(off, token, [
      '--cacert',
      w.interceptCaFile,
      '-H',
      'content-type: application/json',
      '--data-binary',
      call,
      'https://api.anthropic.com/v1/messages',
    ]);
    t.equal(llm.code, 0, llm.stderr);
    t.match(JSON.parse(llm.stdout), { content: [{ text: REPLY }] });
    const llmFlow = await requestFlow(off, 'api.anthropic.com:443/v1/messages');
    t.match(llmFlow, { proto: 'https', attrs: { route: 'llmproxy', status: '200' } });
    for (const key of CAPTURE_KEYS) t.notOk(key in llmFlow.attrs, `llm host: no ${key}`);

    // …and llmproxy still governs it: an API key in the body is refused there.
    const llmBefore = llmproxy.records('llm_audit_log').length;
    const leak = await w.curlVia(off, token, [
      '--cacert',
      w.interceptCaFile,
      '-w',
      '\n%{http_code}',
      '-H',
      'content-type: application/json',
      '--data-binary',
      JSON.stringify({
        model: 'claude-cli',
        max_tokens: 8,
        messages: [{ role: 'user', content: 'key sk-ant-api03-Xq7Rt2Lm9Kp4Vn8Wz3Hy6Bc1Df5Gj0Ab' }],
      }),
      'https://api.anthropic.com/v1/messages',
    ]);
    t.match(leak.stdout, /"content_policy_violation"[\s\S]*\n403$/);
    t.ok(await until(() => llmproxy.records('llm_audit_log').length > llmBefore));
    t.match(llmproxy.records('llm_audit_log').at(-1), { agent_id: 'agent-1', decision: 'block', status: 403 });
    t.notMatch(JSON.stringify(off.records('network_flow')), /Xq7Rt2Lm9Kp4Vn8W/, 'the key is in no gateway record');
  },
);

t.test('--http-capture-max-body 0: the 16 KiB default', async (t) => {
  t.setTimeout(30_000);
  const gw = await w.gateway([...interceptFlags(w, null), '--http-capture-max-body', '0']);
  const body = 'b'.repeat(20_000);
  const r = await post(gw, `${secureUrl}/default-limit`, body);
  t.equal(r.code, 0, r.stderr);
  const flow = await requestFlow(gw, '/default-limit');
  t.equal(flow.attrs.request_body.length, 16 * 1024);
  t.equal(flow.attrs.request_truncated, 'true');
  t.equal(flow.attrs.request_body_bytes, '20000');
  t.equal(await gw.stop(), 0);
});
