import t from 'tap';
import https from 'node:https';
import { mkdtemp, writeFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { X509Certificate } from 'node:crypto';
import { ensureDevCertificates, generateCa, issueCertificate, loadTls } from '../../core/tls.ts';
import { TlsConfigError } from '../../core/errors.ts';

t.test('a generated CA issues a server certificate that real TLS clients trust', async (t) => {
  const ca = await generateCa('test CA');
  const leaf = await issueCertificate(ca, {
    commonName: 'localhost',
    dnsNames: ['localhost'],
    ipAddresses: ['127.0.0.1'],
  });
  const x = new X509Certificate(leaf.certPem);
  t.ok(x.verify(new X509Certificate(ca.certPem).publicKey), 'signed by the CA');
  t.equal(x.publicKey.asymmetricKeyDetails?.namedCurve, 'prime256v1');
  const server = https.createServer({ cert: leaf.certPem, key: leaf.keyPem }, (_req, res) => res.end('ok'));
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  t.teardown(() => server.close());
  const port = (server.address() as { port: number }).port;
  const get = (ca?: string) =>
    new Promise<string>((resolve, reject) => {
      https
        .get({ host: '127.0.0.1', port, ca, agent: false }, (res) => {
          let body = '';
          res.on('data', (d) => (body += d));
          res.on('end', () => resolve(body));
        })
        .on('error', reject);
    });
  t.equal(await get(ca.certPem), 'ok');
  await t.rejects(get(undefined), /self-signed|unable to verify|certificate/i, 'untrusted without the CA');
});

t.test('client certificates carry clientAuth and a short lifetime when asked', async (t) => {
  const ca = await generateCa();
  const leaf = await issueCertificate(ca, { commonName: 'agent-1', usage: 'client', lifetimeMs: 5 * 60_000 });
  const x = new X509Certificate(leaf.certPem);
  t.equal(x.subject, 'CN=agent-1');
  t.ok(x.keyUsage?.includes('1.3.6.1.5.5.7.3.2'), 'clientAuth');
  t.ok(new Date(x.validTo).getTime() - Date.now() <= 7 * 60_000);
});

t.test('loadTls names what is wrong', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'dvx-tls-'));
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  await t.rejects(loadTls({}), /--tls-cert and --tls-key are required/);
  await t.rejects(
    loadTls({ cert: join(dir, 'nope.pem'), key: join(dir, 'nope.pem') }),
    /cannot read certificate .*ENOENT/,
  );
  await writeFile(join(dir, 'junk.pem'), 'not pem');
  await t.rejects(loadTls({ cert: join(dir, 'junk.pem'), key: join(dir, 'junk.pem') }), TlsConfigError);
  const paths = await ensureDevCertificates(dir);
  const other = await generateCa();
  await writeFile(join(dir, 'other-key.pem'), other.keyPem);
  await t.rejects(loadTls({ cert: paths.serverCert, key: join(dir, 'other-key.pem') }), /does not match/);
  const ok = await loadTls({ cert: paths.serverCert, key: paths.serverKey, ca: paths.caCert });
  t.ok(ok.cert.length > 0 && ok.key.length > 0 && ok.ca);
  const again = await ensureDevCertificates(dir);
  t.same(again, paths, 'reused on the next run');
});
