import { gzipSync } from 'node:zlib';
import t from 'tap';
import { parseRawAnswer } from '../../fixtures/raw-tls.ts';
import { until } from '../../fixtures/eventually.ts';
import { AGENT_SECRET, GITHUB_TOKEN, startHarness } from './intercept-harness.ts';
import { exchangeRaw, openTunnel } from './intercept-tunnel.ts';

// Shapes an agent could use inside a terminated tunnel to reach another host than the one admitted, to
// send a body past inspection, or to make the destination see something other than what was checked.
// Each must be refused, or forwarded as exactly what the gateway inspected.

t.setTimeout(90_000);
const RULE = 'host=dest.test,header=Authorization,secret=github_token,format=Bearer {}';
const h = await startHarness({
  options: { injectCred: [RULE] },
  secrets: { 'agent:agent-1': { db_password: AGENT_SECRET, github_token: GITHUB_TOKEN } },
});
t.teardown(() => h.close());
const up = h.upstream;
const host = `dest.test:${up.port}`;

t.afterEach(() => {
  up.handle = (_req, res) => res.end('ok');
});

async function raw(text: string, count = 1, to = 'dest.test') {
  const tunnel = await openTunnel(h, to, up.port);
  return exchangeRaw(tunnel, text, count, 5000);
}

/** Sends bytes in a tunnel to dest.test; what came back once `done` holds (or the tunnel closed). */
async function rawBytes(bytes: Buffer, done: (text: string) => boolean): Promise<string> {
  const tunnel = await openTunnel(h, 'dest.test', up.port);
  const socket = tunnel.tls!;
  let text = '';
  socket.on('data', (d: Buffer) => (text += d.toString('latin1')));
  socket.write(bytes);
  await until(() => done(text) || socket.destroyed, 5000);
  socket.destroy();
  return text;
}
const answered = (text: string) => /\r\n\r\n\{.*\}$/.test(text.replace(/^HTTP\/1\.1 100 Continue\r\n\r\n/, ''));

t.test('Expect: 100-continue with a blocked body: the destination never sees the headers', async (t) => {
  const before = up.seen.length;
  const body = `{"password":"${AGENT_SECRET}"}`;
  const text = await rawBytes(
    Buffer.from(
      `POST /expect HTTP/1.1\r\nHost: ${host}\r\nExpect: 100-continue\r\nContent-Length: ${body.length}\r\n\r\n${body}`,
    ),
    answered,
  );
  const final = text.replace(/^HTTP\/1\.1 100 Continue\r\n\r\n/, '');
  t.equal(parseRawAnswer(final).status, 403);
  t.equal(up.seen.length, before);
});

t.test('a secret split across chunks, or behind chunk extensions, is still found', async (t) => {
  const before = up.seen.length;
  const half = Math.floor(AGENT_SECRET.length / 2);
  const a = `{"p":"${AGENT_SECRET.slice(0, half)}`;
  const b = `${AGENT_SECRET.slice(half)}"}`;
  const text = await raw(
    `POST /chunks HTTP/1.1\r\nHost: ${host}\r\nTransfer-Encoding: chunked\r\n\r\n` +
      `${a.length.toString(16)};ext="x"\r\n${a}\r\n${b.length.toString(16)}\r\n${b}\r\n0\r\n\r\n`,
  );
  t.equal(parseRawAnswer(text).status, 403);
  t.equal(up.seen.length, before);
});

t.test('a gzip body whose secret is in a second gzip member is found', async (t) => {
  const before = up.seen.length;
  const body = Buffer.concat([gzipSync('{"a":"harmless"}'), gzipSync(`{"p":"${AGENT_SECRET}"}`)]);
  const text = await rawBytes(
    Buffer.concat([
      Buffer.from(
        `POST /members HTTP/1.1\r\nHost: ${host}\r\nContent-Encoding: gzip\r\nContent-Length: ${body.length}\r\n\r\n`,
      ),
      body,
    ]),
    answered,
  );
  t.equal(parseRawAnswer(text).status, 403);
  t.equal(up.seen.length, before);
});

t.test('absolute-form naming another host, scheme or port inside the tunnel: 421, nothing sent', async (t) => {
  const before = up.seen.length;
  for (const target of [`https://other.test:${up.port}/x`, `http://dest.test:${up.port}/x`, `https://dest.test:1/x`]) {
    const text = await raw(`GET ${target} HTTP/1.1\r\nHost: ${host}\r\n\r\n`);
    t.equal(parseRawAnswer(text).status, 421, target);
  }
  // Userinfo is refused outright (400), whichever host it sits before.
  for (const target of [`https://dest.test@other.test:${up.port}/x`, `https://other.test@dest.test:${up.port}/x`]) {
    const text = await raw(`GET ${target} HTTP/1.1\r\nHost: ${host}\r\n\r\n`);
    t.equal(parseRawAnswer(text).status, 400, target);
  }
  const same = await raw(`GET https://DEST.test.:${up.port}/same?q=1 HTTP/1.1\r\nHost: ${host}\r\n\r\n`);
  t.equal(parseRawAnswer(same).status, 200, 'the tunnel host itself, in another spelling, is served');
  t.equal(up.seen.at(-1)?.url, '/same?q=1');
  t.equal(up.seen.length, before + 1);
});

t.test('HTTP/2 preface, CONNECT and an Upgrade inside the tunnel: nothing but HTTP/1.1 goes on', async (t) => {
  const before = up.seen.length;
  const h2 = await raw('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n');
  t.equal(parseRawAnswer(h2).status, 400, 'the h2 preface');
  const connect = await raw(`CONNECT other.test:443 HTTP/1.1\r\nHost: other.test:443\r\n\r\n`);
  t.notMatch(connect, /^HTTP\/1\.1 200/, 'no tunnel inside the tunnel');
  t.equal(up.seen.length, before);
  const upgrade = await raw(
    `GET /ws HTTP/1.1\r\nHost: ${host}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n`,
  );
  t.equal(parseRawAnswer(upgrade).status, 200, 'answered as a plain request');
  t.equal(up.seen.at(-1)?.headers.upgrade, undefined, 'the Upgrade went no further');
});

t.test('the injected credential: the agent cannot add its own beside it, nor in a trailer', async (t) => {
  const text = await raw(
    `POST /trailer HTTP/1.1\r\nHost: ${host}\r\nauthorization: Bearer agent-1\r\nAUTHORIZATION: Bearer agent-2\r\n` +
      `Transfer-Encoding: chunked\r\nTrailer: Authorization\r\n\r\n2\r\nhi\r\n0\r\nAuthorization: Bearer agent-trailer\r\n\r\n`,
  );
  t.equal(parseRawAnswer(text).status, 200);
  const seen = up.seen.at(-1)!;
  const auth = [];
  for (let i = 0; i < seen.rawHeaders.length; i += 2)
    if (seen.rawHeaders[i].toLowerCase() === 'authorization') auth.push(seen.rawHeaders[i + 1]);
  t.same(auth, [`Bearer ${GITHUB_TOKEN}`], "one Authorization: the gateway's");
  t.equal(seen.body.toString(), 'hi');
});

t.test('an answer echoing the credential reaches the agent but not the record', async (t) => {
  up.handle = (req, res) => res.end(`you sent ${req.headers.authorization}`);
  const text = await raw(`GET /echo HTTP/1.1\r\nHost: ${host}\r\n\r\n`);
  t.equal(parseRawAnswer(text).status, 200);
  t.ok(await until(() => h.flows().some((r) => String((r.attrs as Record<string, string>).url).endsWith('/echo'))));
  t.notOk(JSON.stringify(h.audit).includes(GITHUB_TOKEN), 'no record holds it');
});
