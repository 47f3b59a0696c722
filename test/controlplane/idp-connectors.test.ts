import t from 'tap';
import { startCpHarness } from '../fixtures/controlplane-harness.ts';

// IdP connectors of an org: org:manage over the org in the path; client_secret is written, kept and
// never answered.
const h = await startCpHarness(
  [
    { clientId: 'root', org: 'org-a' },
    { clientId: 'admin-b', org: 'org-b' },
  ],
  { seedAdmin: ['root'] },
);
t.teardown(() => h.close());
await h.call('root', 'POST', '/orgs', { id: 'org-a', name: 'A' });
await h.call('root', 'POST', '/orgs', { id: 'org-b', name: 'B' });
await h.call('root', 'POST', '/orgs/org-b/grants', { principal: 'user:admin-b', role: 'org-admin' });

t.test('put, read back without the secret, update keeping it, delete', async (t) => {
  const body = {
    type: 'oidc',
    issuer: 'https://login.example.com',
    client_id: 'dvx',
    client_secret: 's3cr3t-value',
    groups_attribute: 'groups',
    scopes: ['openid', 'groups'],
  };
  const put = await h.call('root', 'PUT', '/orgs/org-a/idp-connectors/corp', body);
  t.equal(put.status, 200);
  t.same(put.body, { name: 'corp', type: 'oidc', org_id: 'org-a', status: 'active', groups_attribute: 'groups' });
  const list = await h.call('root', 'GET', '/orgs/org-a/idp-connectors');
  t.same(list.body, [put.body]);
  t.notOk(JSON.stringify(list.body).includes('s3cr3t'), 'the secret is never answered');
  const again = await h.call('root', 'PUT', '/orgs/org-a/idp-connectors/corp', {
    ...body,
    client_secret: undefined,
    groups_attribute: 'roles',
  });
  t.equal(again.body.groups_attribute, 'roles');
  t.same((await h.call('root', 'GET', '/orgs/org-a/idp-connectors/corp')).body, again.body);
  t.ok(h.audit.some((r) => r.action === 'idp-connector.put' && r.resource === 'idp-connector:org-a:corp'));
  t.notOk(JSON.stringify(h.audit).includes('s3cr3t'), 'nor written to the audit trail');
  t.equal((await h.call('root', 'DELETE', '/orgs/org-a/idp-connectors/corp')).status, 204);
  t.equal((await h.call('root', 'GET', '/orgs/org-a/idp-connectors/corp')).status, 404);
  t.equal((await h.call('root', 'DELETE', '/orgs/org-a/idp-connectors/corp')).status, 404);
});

t.test("another org's admin is refused; bad bodies name the field", async (t) => {
  t.equal(
    (
      await h.call('admin-b', 'PUT', '/orgs/org-a/idp-connectors/x', {
        type: 'oidc',
        issuer: 'https://a.example',
        client_id: 'c',
      })
    ).status,
    403,
  );
  t.equal(
    (
      await h.call('admin-b', 'PUT', '/orgs/org-b/idp-connectors/saml-1', {
        type: 'saml',
        metadata_url: 'https://idp.example/metadata',
      })
    ).status,
    200,
  );
  const cases: [unknown, RegExp][] = [
    [{ type: 'ldap' }, /^type: must be "oidc" or "saml"/],
    [{ type: 'oidc', client_id: 'c' }, /^issuer: is required/],
    [{ type: 'oidc', issuer: 'ftp://x', client_id: 'c' }, /^issuer: must be https/],
    [{ type: 'oidc', issuer: 'https://x.example' }, /^client_id: is required/],
    [{ type: 'saml' }, /^metadata_url: is required/],
    [{ type: 'oidc', issuer: 'https://x.example', client_id: 'c', scopes: 'openid' }, /^scopes: must be an array/],
    [{ type: 'oidc', issuer: 'https://x.example', client_id: 'c', name: 'other' }, /^name: must match the path/],
    [{ type: 'oidc', issuer: 'https://x.example', client_id: 'c', secret: 'x' }, /^secret: unknown field/],
  ];
  for (const [body, detail] of cases)
    t.match(
      (await h.call('admin-b', 'PUT', '/orgs/org-b/idp-connectors/c1', body)).body,
      { status: 400, detail },
      JSON.stringify(body),
    );
  t.equal(
    (
      await h.call('admin-b', 'PUT', '/orgs/org-b/idp-connectors/Bad Name', {
        type: 'saml',
        metadata_url: 'https://x.example/m',
      })
    ).status,
    400,
  );
});
