import t from 'tap';
import net from 'node:net';
import https from 'node:https';
import type { AddressInfo } from 'node:net';
import { readFile } from 'node:fs/promises';
import { performance } from 'node:perf_hooks';
import { createLogger } from '../../../core/logger.ts';
import { issueCertificate } from '../../../core/tls.ts';
import { ApprovalsClient, parseApprovalView, type ApprovalRequest } from '../../../proxy/llm/approvals-client.ts';
import { ApprovalRateLimitError, ApprovalsUnavailableError } from '../../../proxy/llm/errors.ts';
import { startApprovalsPeer } from '../../fixtures/approvals-peer.ts';
import { tlsDir } from '../../fixtures/tls-dir.ts';

// llmproxy's approvals client against a real TLS peer speaking the broker's satellite approvals API:
// create, long-poll, cancel; 429, 401 and a new token, an unreachable or silent broker, answers too
// large or malformed, an untrusted certificate. Every failure is typed; none hangs past its bound.

const quiet = createLogger({ level: 'error', destination: { write: () => {} } });
const now = () => performance.now();

const body = (over: Partial<ApprovalRequest> = {}): ApprovalRequest => ({
  request_id: 'r-1',
  call_id: 'call-1',
  org_id: 'org-1',
  agent_id: 'agent-1',
  agent_name: 'builder',
  model: 'claude-x',
  tool: 'transfer',
  arguments: '{"amount":500}',
  args_digest: 'd'.repeat(64),
  rule: 'money.rules[0]',
  summary: 'large transfers need a person',
  policy_version: '0123456789abcdef',
  expires_in_ms: 60_000,
  ...over,
});

t.test('create, long-poll until a person decides, then cancel is 409', async (t) => {
  const peer = await startApprovalsPeer();
  t.teardown(() => peer.close());
  const client = await ApprovalsClient.open({
    url: peer.url,
    tokenFile: peer.tokenFile,
    ca: await readFile(peer.caFile),
    log: quiet,
  });
  t.teardown(() => client.close());
  const created = await client.create(body());
  t.match(created, { status: 'pending', args_digest: 'd'.repeat(64), policy_version: '0123456789abcdef' });
  t.match(peer.created[0], { call_id: 'call-1', tool: 'transfer', arguments: '{"amount":500}', expires_in_ms: 60_000 });

  setTimeout(() => peer.decide(created.id, 'approved', 'alice@example.com'), 200);
  const started = now();
  const view = await client.waitDecided(created.id, now() + 10_000, now);
  t.equal(view.status, 'approved');
  t.equal(view.decided_by, 'alice@example.com');
  t.ok(now() - started < 2000, 'the long poll answered as soon as it was decided');
  t.ok(
    peer.requests.some((r) => /GET \/v1\/satellite\/approvals\/[^?]+\?wait=(9|10)$/.test(r)),
    'waits at most the time left',
  );
  t.equal(await client.cancel(created.id), null, 'a decided approval cannot be cancelled (409)');
});

t.test('cancel a pending approval; a deadline with no decision returns it still pending', async (t) => {
  const peer = await startApprovalsPeer();
  t.teardown(() => peer.close());
  const client = await ApprovalsClient.open({
    url: peer.url,
    tokenFile: peer.tokenFile,
    ca: await readFile(peer.caFile),
    log: quiet,
  });
  t.teardown(() => client.close());
  const a = await client.create(body());
  const started = now();
  const view = await client.waitDecided(a.id, now() + 1200, now);
  t.equal(view.status, 'pending');
  t.ok(
    now() - started >= 1000 && now() - started < 4000,
    `waited about the deadline (${Math.round(now() - started)} ms)`,
  );
  const cancelled = await client.cancel(a.id);
  t.equal(cancelled?.status, 'cancelled');
  t.same(peer.cancelled, [a.id]);
});

t.test('the wait asks for at most 30 s per poll', async (t) => {
  const peer = await startApprovalsPeer();
  t.teardown(() => peer.close());
  const client = await ApprovalsClient.open({
    url: peer.url,
    tokenFile: peer.tokenFile,
    ca: await readFile(peer.caFile),
    log: quiet,
  });
  t.teardown(() => client.close());
  const a = await client.create(body());
  setTimeout(() => peer.decide(a.id, 'denied', 'bob', 'no'), 100);
  const view = await client.waitDecided(a.id, now() + 300_000, now);
  t.match(view, { status: 'denied', reason: 'no', decided_by: 'bob' });
  t.ok(peer.requests.some((r) => r.endsWith('?wait=30')));
});

t.test('429 is the rate limit; an aborted wait rejects at once', async (t) => {
  const peer = await startApprovalsPeer();
  t.teardown(() => peer.close());
  const client = await ApprovalsClient.open({
    url: peer.url,
    tokenFile: peer.tokenFile,
    ca: await readFile(peer.caFile),
    log: quiet,
  });
  t.teardown(() => client.close());
  peer.limit = 1;
  const a = await client.create(body());
  await t.rejects(client.create(body()), ApprovalRateLimitError);
  await t.rejects(client.create(body()), /approval rate limit exceeded/);

  const abort = new AbortController();
  setTimeout(() => abort.abort(new Error('the agent disconnected')), 150);
  const started = now();
  await t.rejects(client.waitDecided(a.id, now() + 20_000, now, abort.signal), /the agent disconnected/);
  t.ok(now() - started < 2000, 'the abort ends the long poll');
});

t.test('a 401 reads the token file again and tries once more; a wrong token stays refused', async (t) => {
  const peer = await startApprovalsPeer();
  t.teardown(() => peer.close());
  const client = await ApprovalsClient.open({
    url: peer.url,
    tokenFile: peer.tokenFile,
    ca: await readFile(peer.caFile),
    log: quiet,
  });
  t.teardown(() => client.close());
  await peer.setToken('a-new-satellite-token-9876');
  t.equal((await client.create(body())).status, 'pending', 'the new token was read');
  peer.token = 'only-the-broker-knows';
  await t.rejects(client.create(body()), { name: 'ApprovalsUnavailableError', message: /answered 401/ });
});

t.test(
  'unreachable, silent, oversized, malformed, untrusted: ApprovalsUnavailableError within the bounds',
  async (t) => {
    const peer = await startApprovalsPeer();
    t.teardown(() => peer.close());
    const ca = await readFile(peer.caFile);
    const open = (url: string, extra: { requestTimeoutMs?: number; ca?: Buffer | undefined } = {}) =>
      ApprovalsClient.open({ url, tokenFile: peer.tokenFile, ca, log: quiet, ...extra });

    // Nothing listens on the port.
    const free = net.createServer();
    await new Promise<void>((r) => free.listen(0, '127.0.0.1', r));
    const port = (free.address() as AddressInfo).port;
    await new Promise<void>((r) => free.close(() => r()));
    const gone = await open(`https://127.0.0.1:${port}`);
    t.teardown(() => gone.close());
    await t.rejects(gone.create(body()), { name: 'ApprovalsUnavailableError', message: /unreachable/ });
    // A long poll against nothing retries until the deadline, then says why.
    const started = now();
    await t.rejects(gone.waitDecided('x', now() + 700, now), {
      name: 'ApprovalsUnavailableError',
      message: /before the escalation deadline: approval service unreachable/,
    });
    t.ok(now() - started < 3000);

    // A broker that accepts and never answers: bounded by the request timeout.
    const client = await open(peer.url, { requestTimeoutMs: 300 });
    t.teardown(() => client.close());
    peer.fault = (req) => {
      req.resume();
      return true; // never answers
    };
    const t0 = now();
    await t.rejects(client.create(body()), ApprovalsUnavailableError);
    t.ok(now() - t0 < 3000, `silent broker cut after ${Math.round(now() - t0)} ms`);
    await t.rejects(client.cancel('x'), ApprovalsUnavailableError);

    // An answer far too large is not read whole.
    peer.fault = (req, res) => {
      req.resume();
      res.writeHead(201, { 'content-type': 'application/json' });
      const piece = Buffer.alloc(1024 * 1024, 0x20);
      let sent = 0;
      const more = () => {
        while (sent < 8 && res.write(piece)) sent++;
        if (sent < 8 && !res.destroyed) res.once('drain', more);
        else res.end();
      };
      more();
      return true;
    };
    await t.rejects(client.create(body()), { name: 'ApprovalsUnavailableError', message: /exceeds/ });

    // Not JSON, not an approval, unknown status, a prototype key.
    for (const [status, text, message] of [
      [201, 'not json', /not JSON/],
      [201, '[]', /not a JSON object/],
      [
        201,
        JSON.stringify({
          id: 'a',
          status: 'maybe',
          args_digest: '',
          policy_version: '',
          created_at: '',
          expires_at: '',
        }),
        /no known status/,
      ],
      [201, '{"__proto__":{"status":"approved"},"id":"a"}', /args_digest is not a string/],
      [500, '{"detail":"boom"}', /answered 500 to POST \/v1\/satellite\/approvals: boom/],
    ] as [number, string, RegExp][]) {
      peer.fault = (req, res) => {
        req.resume();
        res.writeHead(status, { 'content-type': 'application/json' });
        res.end(text);
        return true;
      };
      await t.rejects(client.create(body()), { name: 'ApprovalsUnavailableError', message }, text);
    }
    // A long poll answered 4xx fails at once; 5xx is asked again until the deadline.
    peer.fault = (req, res) => {
      req.resume();
      res.writeHead(404, { 'content-type': 'application/problem+json' });
      res.end('{"detail":"no such approval"}');
      return true;
    };
    await t.rejects(client.waitDecided('nope', now() + 5000, now), { message: /404.*no such approval/ });
    let polls = 0;
    peer.fault = (req, res) => {
      req.resume();
      polls++;
      res.writeHead(503);
      res.end();
      return true;
    };
    await t.rejects(client.waitDecided('x', now() + 1000, now), { message: /before the escalation deadline.*503/ });
    t.ok(polls >= 2, `asked again after a 503 (${polls} polls)`);
    peer.fault = null;

    // A certificate from a CA not given with --broker-ca.
    const other = await tlsDir('dvx-approvals-other-');
    t.teardown(() => other.remove());
    const leaf = await issueCertificate(other.ca, { commonName: 'localhost', ipAddresses: ['127.0.0.1'] });
    const stranger = https.createServer({ cert: leaf.certPem, key: leaf.keyPem }, (_req, res) => res.end('{}'));
    await new Promise<void>((r) => stranger.listen(0, '127.0.0.1', r));
    t.teardown(() => new Promise<void>((r) => stranger.close(() => r())));
    const untrusting = await open(`https://127.0.0.1:${(stranger.address() as AddressInfo).port}`);
    t.teardown(() => untrusting.close());
    await t.rejects(untrusting.create(body()), { name: 'ApprovalsUnavailableError', message: /unreachable/ });
  },
);

t.test('a token file that cannot be read refuses to open', async (t) => {
  await t.rejects(
    ApprovalsClient.open({ url: 'https://127.0.0.1:1', tokenFile: '/nonexistent/token', log: quiet }),
    /cannot read --secret-broker-token-file .*ENOENT/,
  );
});

t.test('parseApprovalView: nulls and missing optional fields', async (t) => {
  const v = parseApprovalView({
    id: 'a',
    status: 'pending',
    args_digest: 'x',
    policy_version: 'v',
    created_at: 'c',
    expires_at: 'e',
  });
  t.match(v, { reason: null, decided_by: null, decided_at: null });
  t.throws(() => parseApprovalView({ ...v, decided_by: 5 }), /decided_by is not a string/);
});
