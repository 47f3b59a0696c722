import t from 'tap';
import { ImdsOptionsError } from '../../../proxy/imds/errors.ts';
import {
  DEFAULT_IMDS_SOCKET,
  parseSocketMode,
  validateImdsOptions,
  type ImdsOptions,
} from '../../../proxy/imds/options.ts';

// imds's one validation: the defaults, and every combination it refuses, each with a message naming
// the flag. (The same refusals through `dvx serve imds`: cli.test.ts.)

t.test('defaults: the spec socket, 0660, no rules', async (t) => {
  const o = validateImdsOptions({ agentId: 'agent-1' });
  t.equal(o.imdsSocket, DEFAULT_IMDS_SOCKET);
  t.equal(DEFAULT_IMDS_SOCKET, '/run/dvx/imds.sock');
  t.equal(o.imdsSocketMode, 0o660);
  t.same(o.rules, []);
  t.equal(o.auditCaptureOrDeny, true);
});

t.test('rules are parsed by the gateway module, in order, each whole', async (t) => {
  const o = validateImdsOptions({
    agentId: 'a',
    secretsFile: '/x.json',
    injectCred: [
      'host=API.github.com,header=Authorization,secret=gh,format=Bearer {}, more',
      '{"host":"*.corp","port":8443,"header":"X-K","secret":"k"}',
    ],
  });
  t.match(o.rules, [
    { host: 'api.github.com', port: null, header: 'authorization', secret: 'gh', format: 'Bearer {}, more' },
    { host: '*.corp', port: 8443, header: 'x-k', secret: 'k', format: '{}' },
  ]);
});

t.test('--imds-socket-mode parses octal', async (t) => {
  t.equal(parseSocketMode('660'), 0o660);
  t.equal(parseSocketMode('0600'), 0o600);
  for (const bad of ['', '66', '0o660', '8', '12345', 'rw-rw----', '-660'])
    t.throws(() => parseSocketMode(bad), ImdsOptionsError, JSON.stringify(bad));
});

t.test('what the validation refuses', async (t) => {
  const base: Partial<ImdsOptions> = { agentId: 'agent-1', imdsSocket: '/tmp/x/imds.sock' };
  const cases: [Partial<ImdsOptions>, RegExp][] = [
    [{ agentId: '' }, /--agent-id is required/],
    [{ agentId: '../etc' }, /--agent-id "..\/etc" is not an agent id/],
    [{ agentId: 'a'.repeat(129) }, /is not an agent id/],
    [{ orgId: 'org 1' }, /--org-id "org 1" is not an org id/],
    [{ imdsSocket: 'run/imds.sock' }, /--imds-socket must be an absolute path/],
    [{ imdsSocket: `/tmp/${'d'.repeat(120)}.sock` }, /longer than a unix socket path may be/],
    [{ imdsSocket: '/tmp/a\nb.sock' }, /NUL or a line break/],
    [{ imdsSocketMode: 0o666 }, /must not let every local user connect/],
    [{ imdsSocketMode: 0o1770 }, /between 000 and 777/],
    [{ imdsSocketMode: 1.5 }, /between 000 and 777/],
    [{ secretsFile: '/s.json', secretBrokerUrl: 'https://b' }, /choose one/],
    [
      { secretBrokerUrl: 'b:8450', secretBrokerTokenFile: '/t' },
      /--secret-broker-url must be https|not an absolute URL/,
    ],
    [{ secretBrokerUrl: 'http://b:8450', secretBrokerTokenFile: '/t' }, /--secret-broker-url must be https/],
    [{ secretBrokerUrl: 'https://b:8450' }, /needs --secret-broker-token-file/],
    [{ secretBrokerTokenFile: '/t' }, /--secret-broker-token-file is the token of --secret-broker-url/],
    [{ brokerCa: '/ca.pem' }, /--broker-ca is the CA of --secret-broker-url/],
    [{ injectCred: ['host=x,header=X,secret=s'] }, /--inject-cred needs a secret source/],
    [{ secretsFile: '/s', injectCred: ['host=x,header=Host,secret=s'] }, /header Host cannot be injected/],
    [{ secretsFile: '/s', injectCred: ['host=x,header=X,secret=s,format=no placeholder'] }, /format must hold \{\}/],
    [{ secretsFile: '/s', injectCred: ['{"host":'] }, /not valid JSON/],
    [{ metricsAddr: '127.0.0.1:0' }, /--metrics-addr needs --tls-cert and --tls-key/],
    [{ metricsAddr: '127.0.0.1:0', tlsCert: '/c' }, /--metrics-addr needs --tls-cert and --tls-key/],
    [{ headersTimeout: 0 }, /--headers-timeout must be a positive duration/],
    [{ headersTimeout: 60_000, requestTimeout: 30_000 }, /must not exceed --request-timeout/],
    [{ keepAliveTimeout: Number.NaN }, /--keep-alive-timeout must be a positive duration/],
    [{ maxConnections: 0 }, /--max-connections must be a positive integer/],
    [{ auditDsn: 'pglite:///x' }, /--audit-wal-dir is required/],
    [{ auditWalDir: '/w' }, /needs --audit-dsn/],
    [{ auditCaptureTimeout: 0 }, /--audit-capture-timeout must be positive/],
  ];
  for (const [input, message] of cases) {
    t.throws(
      () => validateImdsOptions({ ...base, ...input }),
      { name: 'ImdsOptionsError', code: 'DVX_IMDS_OPTIONS', message },
      JSON.stringify(input),
    );
  }
});
