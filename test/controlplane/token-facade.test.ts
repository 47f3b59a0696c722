import t from 'tap';
import { startCpHarness } from '../fixtures/controlplane-harness.ts';

// POST /oauth/token through to a real issuer (oidc-provider's token endpoint as the override).
const h = await startCpHarness([{ clientId: 'svc', org: 'org-a' }]);
t.teardown(() => h.close());
const cp = await h.start({ tokenEndpointOverride: `${h.issuer.issuer}/token` });
t.teardown(() => cp.close());

async function post(body: string, headers: Record<string, string>) {
  const res = await h.rawAt(cp.port, 'POST', '/oauth/token', body, headers);
  return res;
}

t.test('a client-credentials exchange passes through; the token works on the API', async (t) => {
  const r = await post('grant_type=client_credentials&scope=api&resource=https%3A%2F%2Fcontrolplane.dvx.test', {
    'content-type': 'application/x-www-form-urlencoded',
    authorization: `Basic ${Buffer.from('svc:secret-svc').toString('base64')}`,
  });
  t.equal(r.status, 200);
  t.equal(r.headers['cache-control'], 'no-store');
  const body = JSON.parse(r.text);
  t.match(body, { access_token: /^ey/, token_type: 'Bearer', expires_in: Number });
  const who = await h.rawAt(cp.port, 'GET', '/api/v1/whoami', undefined, {
    authorization: `Bearer ${body.access_token}`,
  });
  t.match(JSON.parse(who.text), { subject: 'svc', kind: 'service' });
});

t.test("issuer errors pass through verbatim; the facade's own are RFC 6749 bodies", async (t) => {
  const wrong = await post('grant_type=client_credentials', {
    'content-type': 'application/x-www-form-urlencoded',
    authorization: `Basic ${Buffer.from('svc:nope').toString('base64')}`,
  });
  t.equal(wrong.status, 401);
  t.match(JSON.parse(wrong.text), { error: 'invalid_client' });
  const missing = await post(JSON.stringify({ scope: 'api' }), { 'content-type': 'application/json' });
  t.equal(missing.status, 400);
  t.same(JSON.parse(missing.text), {
    error: 'invalid_request',
    error_description: 'grant_type is required',
    error_uri: 'https://www.rfc-editor.org/rfc/rfc6749#section-5.2',
  });
  const down = await h.start({ tokenEndpointOverride: 'http://127.0.0.1:9/token' });
  t.teardown(() => down.close());
  const unreachable = await h.rawAt(down.port, 'POST', '/oauth/token', 'grant_type=client_credentials', {
    'content-type': 'application/x-www-form-urlencoded',
  });
  t.equal(unreachable.status, 502);
  t.match(JSON.parse(unreachable.text), { error: 'temporarily_unavailable' });
});
