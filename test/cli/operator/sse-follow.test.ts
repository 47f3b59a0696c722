import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { CliError } from '../../../cli/errors.ts';
import { OperatorClient } from '../../../cli/operator/operator-client.ts';
import { follow } from '../../../cli/operator/sse-follow.ts';

// Following an event stream (and one plain call) against a server that misbehaves (a real HTTP server, the real client):
// the follower must end with a clear error instead of reconnecting forever or growing without bound,
// and must say so when it cannot resume without loss.

type Handler = (req: IncomingMessage, res: ServerResponse, n: number) => void;
let handler: Handler = (_req, res) => res.writeHead(500).end();
let connections = 0;
const lastEventIds: (string | undefined)[] = [];
const server = createServer((req, res) => {
  connections++;
  lastEventIds.push(req.headers['last-event-id'] as string | undefined);
  handler(req, res, connections);
});
await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
const dir = await mkdtemp(join(tmpdir(), 'dvx-sse-follow-'));
const tokenFile = join(dir, 'token');
await writeFile(tokenFile, 'tok');
t.teardown(async () => {
  server.closeAllConnections();
  server.close();
  await rm(dir, { recursive: true, force: true });
});
const client = new OperatorClient({
  controlplane: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
  tokenFile,
  insecureSkipVerify: false,
  output: 'json',
});
t.teardown(() => client.close());
const sse = (res: ServerResponse) => res.writeHead(200, { 'content-type': 'text/event-stream' });

async function run(stopAfter: number) {
  connections = 0;
  lastEventIds.length = 0;
  const abort = new AbortController();
  const notes: string[] = [];
  const events: string[] = [];
  // A guard, not an assertion: a follower that loops is stopped after `stopAfter` connections or notes.
  const guard = setInterval(() => {
    if (connections >= stopAfter || notes.length >= stopAfter) abort.abort();
  }, 20);
  try {
    await follow(
      client,
      { path: '/api/v1/stream' },
      { signal: abort.signal, onEvent: (e) => void events.push(e.data), onNote: (n) => void notes.push(n) },
    );
    return { error: undefined as unknown, notes, events, aborted: abort.signal.aborted };
  } catch (error) {
    return { error, notes, events, aborted: abort.signal.aborted };
  } finally {
    clearInterval(guard);
  }
}

t.test(
  'an event id that cannot go back as Last-Event-ID ends the follow with an error, not a reconnect loop',
  async (t) => {
    handler = (_req, res) => {
      sse(res);
      res.end('id: 日本\ndata: one\n\n');
    };
    const r = await run(4);
    t.same(r.events, ['one']);
    t.ok(r.error instanceof CliError, `an error, not ${r.aborted ? 'a loop stopped by the guard' : String(r.error)}`);
    t.match((r.error as Error).message, /event id/);
    t.notOk(
      r.notes.some((n) => /cannot reach/.test(n)),
      'no "cannot reach" for a server that answered',
    );
  },
);

t.test('an event that never ends is bounded: an error, not unbounded memory', async (t) => {
  handler = (_req, res) => {
    sse(res);
    res.write('data: ');
    const chunk = Buffer.alloc(1024 * 1024, 'a');
    let sent = 0;
    const pump = () => {
      while (sent < 64 && res.write(chunk)) sent++;
      if (sent < 64) res.once('drain', pump);
      else res.end();
    };
    pump();
  };
  const r = await run(3);
  t.ok(r.error instanceof CliError, `an error, not ${r.aborted ? 'a loop stopped by the guard' : String(r.error)}`);
  t.match((r.error as Error).message, /larger than/);
  t.equal(connections, 1, 'the same oversized event is not fetched again');
});

t.test('a stream without event ids: reconnecting says that events may be lost', async (t) => {
  handler = (_req, res, n) => {
    sse(res);
    res.end(`data: event ${n}\n\n`);
  };
  const r = await run(2);
  t.same(r.events.slice(0, 1), ['event 1']);
  t.same(lastEventIds.slice(0, 2), [undefined, undefined]);
  t.ok(
    r.notes.some((n) => /no event id/.test(n)),
    'the operator is told the resume point is unknown',
  );
});

t.test('ids are sent back on reconnect (a fair server)', async (t) => {
  handler = (_req, res, n) => {
    sse(res);
    res.end(`id: ${n}\ndata: event ${n}\n\n`);
  };
  const r = await run(3);
  t.same(lastEventIds.slice(0, 3), [undefined, '1', '2']);
  t.same(r.events.slice(0, 2), ['event 1', 'event 2']);
  t.notOk(r.notes.some((n) => /no event id/.test(n)));
});

t.test(
  'a minted token that cannot be sent as a header: an error naming the issuer, not a reconnect loop',
  async (t) => {
    const { generateKeyPair, exportJWK } = await import('jose');
    const { privateKey } = await generateKeyPair('ES256', { extractable: true });
    const base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    const keyFile = join(dir, 'sa-key.json');
    await writeFile(
      keyFile,
      JSON.stringify({
        type: 'service_account_key',
        issuer: base,
        client_id: 'sa',
        key_id: 'k1',
        key: { ...(await exportJWK(privateKey)), alg: 'ES256' },
      }),
    );
    handler = (req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      if (req.url === '/.well-known/openid-configuration')
        return res.end(JSON.stringify({ issuer: base, token_endpoint: `${base}/token` }));
      if (req.url === '/token') return res.end(JSON.stringify({ access_token: 'tok\u65e5\n', expires_in: 300 }));
      res.end('{}');
    };
    const minting = new OperatorClient({
      controlplane: base,
      idpKey: keyFile,
      issuer: base,
      insecureSkipVerify: false,
      output: 'json',
    });
    t.teardown(() => minting.close());
    connections = 0;
    const abort = new AbortController();
    const notes: string[] = [];
    const guard = setInterval(() => {
      if (notes.length >= 3) abort.abort();
    }, 20);
    const error = await follow(
      minting,
      { path: '/api/v1/stream' },
      { signal: abort.signal, onEvent: () => {}, onNote: (n) => void notes.push(n) },
    ).then(
      () => undefined,
      (e: unknown) => e,
    );
    clearInterval(guard);
    t.ok(
      error instanceof CliError,
      `an error, not ${abort.signal.aborted ? 'a loop stopped by the guard' : String(error)}`,
    );
    t.match((error as Error).message, /issuer/);
  },
);

t.test('a call whose answer never ends (a byte now and then) is bounded by the call deadline', async (t) => {
  handler = (_req, res) => {
    res.writeHead(200, { 'content-type': 'application/json' });
    res.write('[');
    const drip = setInterval(() => res.write(' '), 50);
    res.on('close', () => clearInterval(drip));
  };
  const slow = new OperatorClient(
    {
      controlplane: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
      tokenFile,
      insecureSkipVerify: false,
      output: 'json',
    },
    { deadlineMs: 500 },
  );
  t.teardown(() => slow.close());
  await t.rejects(slow.call({ method: 'GET', path: '/api/v1/orgs' }), {
    name: 'CliError',
    exitCode: 3,
    message: /did not answer within/,
  });
});
