import t from 'tap';
import type tap from 'tap';
import { startCpHarness } from '../fixtures/controlplane-harness.ts';
import { openTls, parseRawAnswer } from '../fixtures/raw-tls.ts';

// Every error of the control plane is a Problem with the right status, including the ones fastify and
// node raise before any route runs: oversized headers (431), a path segment past the router's limit
// (414), a body past bodyLimit (413), an unsupported body type (415), a malformed request (400), a
// request that does not arrive in time (408).
const h = await startCpHarness([{ clientId: 'root', org: 'org-a', human: true }], {
  seedAdmin: ['root'],
  headersTimeout: 300,
  requestTimeout: 600,
});
t.teardown(() => h.close());
const token = await h.issuer.token('root');

const isProblem = (
  t: Pick<typeof tap, 'equal' | 'match'>,
  r: { status: number; headers: Record<string, string>; body: string },
  status: number,
  slug: string,
) => {
  t.equal(r.status, status, `status ${status}`);
  t.match(r.headers['content-type'], /^application\/problem\+json/, 'a problem document');
  t.match(JSON.parse(r.body), { type: `https://dvx.dev/problems/${slug}`, status });
};

/** Sends `raw` on a fresh TLS connection and reads the answer until the server closes. */
async function rawExchange(raw: string | Buffer) {
  const c = await openTls(h.cp.port);
  c.socket.write(raw);
  const { closed, text } = await c.closed(10_000);
  return { closed, ...parseRawAnswer(text) };
}

t.test("431: headers past node's limit, as a Problem", async (t) => {
  const r = await rawExchange(
    `GET /api/v1/whoami HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${token}\r\nx-pad: ${'a'.repeat(32 * 1024)}\r\n\r\n`,
  );
  isProblem(t, r, 431, 'headers-too-large');
  t.ok(r.closed, 'and the connection is closed');
});

t.test('400: a malformed request line, as a Problem', async (t) => {
  const r = await rawExchange('NOT HTTP AT ALL\r\n\r\n');
  isProblem(t, r, 400, 'bad-request');
});

t.test('408: headers that never finish, as a Problem (or closed)', async (t) => {
  const r = await rawExchange('GET /healthz HTTP/1.1\r\nhost: x\r\n');
  t.ok(r.closed, 'closed');
  if (r.status !== 0) isProblem(t, r, 408, 'request-timeout');
});

t.test("414: an id past the router's parameter limit, as a Problem", async (t) => {
  const r = await h.rawAt(h.cp.port, 'GET', `/api/v1/enclaves/${'x'.repeat(500)}`, undefined, {
    authorization: `Bearer ${token}`,
  });
  t.equal(r.status, 414);
  t.match(r.headers['content-type'], /^application\/problem\+json/);
  t.match(JSON.parse(r.text), { type: 'https://dvx.dev/problems/uri-too-long', status: 414 });
});

t.test('413: a 10 MB body, as a Problem', async (t) => {
  const body = JSON.stringify({ id: 'org-big', name: 'x'.repeat(10 * 1024 * 1024) });
  const head = `POST /api/v1/orgs HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${token}\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\n\r\n`;
  const c = await openTls(h.cp.port);
  c.socket.write(head);
  c.socket.write(body.slice(0, 64 * 1024));
  const { text } = await c.closed(10_000);
  isProblem(t, parseRawAnswer(text), 413, 'payload-too-large');
  const small = await h.call('root', 'GET', '/orgs');
  t.equal(small.status, 200, 'the server is fine afterwards');
});

t.test('415: a body that is not JSON, as a Problem', async (t) => {
  const r = await h.rawAt(h.cp.port, 'POST', '/api/v1/orgs', '<org/>', {
    authorization: `Bearer ${token}`,
    'content-type': 'application/xml',
  });
  t.equal(r.status, 415, r.text);
  t.match(JSON.parse(r.text), { type: 'https://dvx.dev/problems/unsupported-media-type', status: 415 });
});

t.test('400: JSON that does not parse, as a Problem', async (t) => {
  const r = await h.rawAt(h.cp.port, 'POST', '/api/v1/orgs', '{"id":', {
    authorization: `Bearer ${token}`,
    'content-type': 'application/json',
  });
  t.equal(r.status, 400);
  t.match(JSON.parse(r.text), { type: 'https://dvx.dev/problems/bad-request', status: 400 });
});
