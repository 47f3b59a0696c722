import t from 'tap';
import { gzipSync } from 'node:zlib';
import { request } from 'undici';
import { until } from '../../fixtures/eventually.ts';
import { parseRawAnswer } from '../../fixtures/raw-tls.ts';
import { AGENT_SECRET, attrsOf, flowOf, GITHUB_TOKEN, startHarness } from './intercept-harness.ts';
import { exchangeRaw, openTunnel } from './intercept-tunnel.ts';

// Capture and inspection of terminated requests: what the record keeps (bodies to the limit, flags,
// headers without the sensitive ones, values redacted), the request body inspected before it is sent
// (a secret or an API key blocked, encoded bodies decoded first), the response inspected observe-only,
// and capture off.

t.setTimeout(90_000);
const LIMIT = 64;
const h = await startHarness({ options: { httpCaptureMaxBody: LIMIT, noCaptureHost: ['nocap.test'] } });
t.teardown(() => h.close());
const up = h.upstream;
const dest = `https://dest.test:${up.port}`;
const API_KEY = 'sk-ant-api03-AbCdEf0123456789AbCdEf0123456789AbCdEf0123456789';

t.afterEach(() => {
  up.handle = (_req, res) => res.end('ok');
});

t.test('capture on: bodies to the limit with their flags, headers without the sensitive ones', async (t) => {
  up.handle = (_req, res) => {
    res.setHeader('set-cookie', 'session=upstream-cookie-value');
    res.setHeader('content-type', 'text/plain');
    res.setHeader('x-upstream', 'seen');
    res.end('short answer');
  };
  const body = 'A'.repeat(200);
  const answer = await request(`${dest}/capture?q=1`, {
    dispatcher: h.proxy(),
    method: 'POST',
    headers: {
      authorization: 'Bearer agent-credential-0000',
      cookie: 'c=agent-cookie-value',
      'x-api-key': 'agent-x-api-key-0000',
      'x-visible': 'yes',
      'content-type': 'text/plain',
    },
    body,
  });
  t.equal(answer.statusCode, 200);
  t.equal(await answer.body.text(), 'short answer');
  t.equal(up.seen.at(-1)?.body.toString(), body, 'the whole body went on');
  t.ok(await until(() => flowOf(h, '/capture') !== undefined));
  const a = attrsOf(flowOf(h, '/capture'));
  t.equal(a.method, 'POST');
  t.equal(a.url, `https://dest.test:${up.port}/capture?q=1`);
  t.equal(a.status, '200');
  t.equal(a.request_body, 'A'.repeat(LIMIT));
  t.equal(a.request_truncated, 'true');
  t.equal(a.request_body_bytes, '200');
  t.equal(a.response_body, 'short answer');
  t.equal(a.response_truncated, 'false');
  t.equal(a.response_body_bytes, '12');
  const sent = JSON.parse(a.request_headers) as Record<string, string>;
  t.equal(sent['x-visible'], 'yes');
  for (const name of ['authorization', 'cookie', 'x-api-key', 'proxy-authorization'])
    t.notOk(name in sent, `${name} not recorded`);
  const got = JSON.parse(a.response_headers) as Record<string, string>;
  t.equal(got['x-upstream'], 'seen');
  t.notOk('set-cookie' in got, 'set-cookie not recorded');
  const all = JSON.stringify(h.audit);
  for (const v of ['agent-credential-0000', 'agent-cookie-value', 'agent-x-api-key-0000', 'upstream-cookie-value'])
    t.notOk(all.includes(v), `${v} is in no record`);
});

t.test('a request body carrying the agent secret or an API key is refused 403 before anything is sent', async (t) => {
  const before = up.seen.length;
  for (const [path, body, inspector] of [
    ['/secret', `{"password":"${AGENT_SECRET}"}`, 'secrets'],
    ['/key', `key=${API_KEY}`, 'api_key'],
  ] as const) {
    const answer = await request(`${dest}${path}`, { dispatcher: h.proxy(), method: 'POST', body });
    t.equal(answer.statusCode, 403, path);
    t.same(await answer.body.json(), {
      type: 'error',
      error: { type: 'content_policy_violation', message: 'Request blocked by content security policy.' },
    });
    t.ok(await until(() => flowOf(h, path) !== undefined));
    const rec = flowOf(h, path)!;
    t.match(rec, { outcome: 'deny', reason: `content policy: ${inspector}`, attrs: { status: '403' } });
    const findings = JSON.parse(attrsOf(rec).findings) as { inspector_type: string; match: string }[];
    t.ok(
      findings.some((f) => f.inspector_type === inspector && f.match.endsWith('****')),
      'redacted finding',
    );
    t.notOk(
      JSON.stringify(rec).includes(inspector === 'secrets' ? AGENT_SECRET : API_KEY),
      'the value is not recorded',
    );
  }
  t.equal(up.seen.length, before, 'the destination saw neither');
});

t.test('an encoded body is inspected decoded; a coding that cannot be undone is refused (415)', async (t) => {
  const before = up.seen.length;
  const gz = await request(`${dest}/gzip`, {
    dispatcher: h.proxy(),
    method: 'POST',
    headers: { 'content-encoding': 'gzip' },
    body: gzipSync(`{"password":"${AGENT_SECRET}"}`),
  });
  t.equal(gz.statusCode, 403, 'the secret inside the gzip body is found');
  await gz.body.text();
  const odd = await request(`${dest}/compress`, {
    dispatcher: h.proxy(),
    method: 'POST',
    headers: { 'content-encoding': 'compress' },
    body: 'whatever',
  });
  t.equal(odd.statusCode, 415);
  t.match(await odd.body.json(), { error: { message: /content-encoding compress/ } });
  t.equal(up.seen.length, before);
  const fine = await request(`${dest}/gzip-fine`, {
    dispatcher: h.proxy(),
    method: 'POST',
    headers: { 'content-encoding': 'gzip' },
    body: gzipSync('nothing to see here'),
  });
  t.equal(fine.statusCode, 200);
  await fine.body.text();
  t.same(up.seen.at(-1)?.body, gzipSync('nothing to see here'), 'sent as the agent encoded it');
  t.ok(await until(() => flowOf(h, '/gzip-fine') !== undefined));
  t.equal(attrsOf(flowOf(h, '/gzip-fine')).request_body, 'nothing to see here', 'recorded decoded');
});

t.test('a body past 32 MB is refused 413 as announced, nothing sent', async (t) => {
  const before = up.seen.length;
  const tunnel = await openTunnel(h, 'dest.test', up.port);
  const text = await exchangeRaw(
    tunnel,
    `POST /big HTTP/1.1\r\nHost: dest.test:${up.port}\r\nContent-Length: ${33 * 1024 * 1024}\r\n\r\nstart`,
  );
  const answer = parseRawAnswer(text);
  t.equal(answer.status, 413);
  t.equal(answer.headers.connection, 'close');
  t.equal(up.seen.length, before);
});

t.test('the response: inspected observe-only (findings recorded, answer delivered), values redacted', async (t) => {
  up.handle = (_req, res) => res.end(`contact alice@example.com, password ${AGENT_SECRET}`);
  const answer = await request(`${dest}/leaky`, { dispatcher: h.proxy() });
  t.equal(answer.statusCode, 200, 'never blocked');
  t.equal(await answer.body.text(), `contact alice@example.com, password ${AGENT_SECRET}`, 'delivered as it came');
  t.ok(await until(() => flowOf(h, '/leaky') !== undefined));
  const rec = flowOf(h, '/leaky')!;
  t.equal(rec.outcome, 'allow');
  const findings = JSON.parse(attrsOf(rec).findings) as { inspector_type: string; location: string }[];
  t.ok(
    findings.some((f) => f.inspector_type === 'secrets' && f.location === 'response_body'),
    'the secret is a finding',
  );
  t.equal(attrsOf(rec).response_body, 'contact alice@example.com, password [REDACTED]');
});

t.test('a secret straddling the capture limit leaves no prefix of itself in the record', async (t) => {
  up.handle = (_req, res) => res.end(`${'x'.repeat(LIMIT - 4)}${AGENT_SECRET} and more after it`);
  const answer = await request(`${dest}/straddle`, { dispatcher: h.proxy() });
  await answer.body.text();
  t.ok(await until(() => flowOf(h, '/straddle') !== undefined));
  const a = attrsOf(flowOf(h, '/straddle'));
  t.equal(a.response_body, `${'x'.repeat(LIMIT - 4)}[RED`, 'cut at the limit after redaction');
  t.equal(a.response_truncated, 'true');
});

t.test('a compressed answer is relayed as it came and recorded decoded', async (t) => {
  const packed = gzipSync('hello compressed world');
  up.handle = (_req, res) => res.writeHead(200, { 'content-encoding': 'gzip' }).end(packed);
  const answer = await request(`${dest}/packed`, { dispatcher: h.proxy() });
  t.equal(answer.headers['content-encoding'], 'gzip');
  t.same(Buffer.from(await answer.body.arrayBuffer()), packed);
  t.ok(await until(() => flowOf(h, '/packed') !== undefined));
  t.equal(attrsOf(flowOf(h, '/packed')).response_body, 'hello compressed world');
});

t.test('a --no-capture-host is not terminated for capture, nor captured in plain http', async (t) => {
  t.notOk(h.deps.interceptor!.wants({ host: 'nocap.test', port: 443 }));
  t.ok(h.deps.interceptor!.wants({ host: 'dest.test', port: 443 }));
  const answer = await request(`http://nocap.test:${h.plain.port}/nocap`, {
    dispatcher: h.proxy({ tunnel: false }),
    method: 'POST',
    body: `not inspected ${AGENT_SECRET}`,
  });
  t.equal(answer.statusCode, 200);
  await answer.body.text();
  t.equal(h.plain.seen.at(-1)?.body.toString(), `not inspected ${AGENT_SECRET}`);
  t.ok(await until(() => flowOf(h, '/nocap') !== undefined));
  const a = attrsOf(flowOf(h, '/nocap'));
  t.notOk('request_body' in a || 'request_headers' in a || 'response_body' in a, 'no capture');
});

t.test(
  'capture off: a host of an --inject-cred rule is still terminated and forwarded, nothing captured',
  async (t) => {
    const off = await startHarness({
      options: { httpCapture: false, injectCred: ['host=dest.test,header=X-Token,secret=github_token'] },
    });
    t.teardown(() => off.close());
    t.notOk(off.deps.interceptor!.wants({ host: 'other.test', port: 443 }), 'other hosts pass blind');
    t.ok(off.deps.interceptor!.wants({ host: 'dest.test', port: 443 }));
    const body = `carrying ${AGENT_SECRET}`;
    const answer = await request(`https://dest.test:${off.upstream.port}/off`, {
      dispatcher: off.proxy(),
      method: 'POST',
      body,
    });
    t.equal(answer.statusCode, 200, 'not inspected: forwarded');
    await answer.body.text();
    t.equal(off.upstream.seen.at(-1)?.body.toString(), body);
    t.equal(off.upstream.seen.at(-1)?.headers['x-token'], GITHUB_TOKEN, 'injected all the same');
    t.ok(await until(() => flowOf(off, '/off') !== undefined));
    const a = attrsOf(flowOf(off, '/off'));
    t.match(a, { method: 'POST', status: '200', request_body_bytes: String(body.length) });
    for (const k of ['request_body', 'response_body', 'request_headers', 'response_headers', 'findings'])
      t.notOk(k in a, `no ${k}`);
  },
);

t.test('inspection that fails: refused 503 when fail-closed, forwarded and marked when fail-open', async (t) => {
  const engine = {
    threads: 1,
    inlineThresholdBytes: 0,
    workerUrl: new URL('../../fixtures/faulty-worker.ts', import.meta.url),
  };
  const closed = await startHarness({ options: { inspectFailClosed: true }, engine });
  t.teardown(() => closed.close());
  const refused = await request(`https://dest.test:${closed.upstream.port}/crash`, {
    dispatcher: closed.proxy(),
    method: 'POST',
    body: 'CRASH-WORKER',
  });
  t.equal(refused.statusCode, 503);
  t.match(await refused.body.json(), { error: { type: 'content_inspection_unavailable' } });
  t.equal(closed.upstream.seen.length, 0, 'nothing sent');
  t.ok(await until(() => flowOf(closed, '/crash') !== undefined));
  t.match(flowOf(closed, '/crash'), { outcome: 'deny', reason: 'content inspection unavailable' });

  const open = await startHarness({ engine });
  t.teardown(() => open.close());
  const passed = await request(`https://dest.test:${open.upstream.port}/crash`, {
    dispatcher: open.proxy(),
    method: 'POST',
    body: 'CRASH-WORKER',
  });
  t.equal(passed.statusCode, 200);
  await passed.body.text();
  t.equal(open.upstream.seen.at(-1)?.body.toString(), 'CRASH-WORKER');
  t.ok(await until(() => flowOf(open, '/crash') !== undefined));
  t.match(attrsOf(flowOf(open, '/crash')), { inspection_failopen: 'true', inspection_failures: /request/ });
});
