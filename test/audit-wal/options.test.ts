import t from 'tap';
import { AUDIT_DEFAULTS, auditOptionsProblem } from '../../audit-wal/options.ts';
import { validateOptions as validateProxy } from '../../proxy/llm/options.ts';
import { validateOptions as validateControlPlane } from '../../controlplane/options.ts';

t.test('the audit flags are validated once, the same for every component', async (t) => {
  t.equal(auditOptionsProblem(AUDIT_DEFAULTS), null);
  t.equal(AUDIT_DEFAULTS.auditCaptureTimeout, 5000, 'capture timeout 5s (spec: Limits)');
  t.equal(AUDIT_DEFAULTS.auditCaptureOrDeny, true, 'capture-or-deny on by default');
  const cases: [Partial<typeof AUDIT_DEFAULTS>, RegExp][] = [
    [{ auditDsn: 'pglite:///tmp/x' }, /--audit-wal-dir is required with --audit-dsn/],
    [{ auditWalDir: '/tmp/w' }, /--audit-wal-dir needs --audit-dsn/],
    [{ auditWalMaxBytes: -1 }, /--audit-wal-max-bytes/],
    [{ auditCaptureTimeout: 0 }, /--audit-capture-timeout must be positive/],
  ];
  for (const [bad, message] of cases) {
    t.match(auditOptionsProblem({ ...AUDIT_DEFAULTS, ...bad }), message);
    t.throws(() => validateProxy({ tlsCert: 'c', tlsKey: 'k', agentJwks: 'j', ...bad }), message, 'llmproxy');
    t.throws(() => validateControlPlane({ tlsCert: 'c', tlsKey: 'k', ...bad }), message, 'controlplane');
  }
});
