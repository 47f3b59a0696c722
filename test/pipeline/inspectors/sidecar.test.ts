import t from 'tap';
import {
  callSidecar,
  closeSidecarDispatcher,
  MAX_SIDECAR_RESPONSE_BYTES,
} from '../../../pipeline/inspectors/sidecar.ts';
import { SidecarError } from '../../../pipeline/errors.ts';
import { validateSidecar } from '../../../pipeline/policy/validate.ts';
import { startSidecarServer } from '../../fixtures/sidecar-server.ts';

const server = await startSidecarServer();
t.teardown(async () => {
  await closeSidecarDispatcher();
  await server.close();
});

const sidecar = (path: string, extra: Record<string, unknown> = {}) =>
  validateSidecar({ name: 'guard', url: server.url(path), on_request: true, ...extra }, 's');
const identity = { agentId: '42', orgId: '7', agentName: 'builder' };
const request = Buffer.from(
  JSON.stringify({
    model: 'm',
    messages: [
      { role: 'user', content: 'hi' },
      { role: 'assistant', content: [{ type: 'text', text: 'yo' }] },
    ],
  }),
);

t.test('the protocol: request fields, findings back with the configured severity, redacted', async (t) => {
  const findings = await callSidecar({
    sidecar: sidecar('/good', { severity: 'block' }),
    phase: 'request',
    body: request,
    identity,
  });
  t.same(findings, [
    {
      inspector_type: 'sidecar:guard',
      severity: 'block',
      description: 'toxic content',
      match: 'dang****',
      location: 'sidecar',
    },
  ]);
  const sent = server.received.at(-1)!.body;
  t.same(sent, { agent_id: 42, organization_id: 7, agent_name: 'builder', phase: 'request', body: request.toString() });
  t.notOk('context' in sent, 'no context without include_context');
});

t.test('include_context carries the request messages as recent_messages', async (t) => {
  await callSidecar({
    sidecar: sidecar('/clean', { include_context: true }),
    phase: 'response',
    body: Buffer.from('{"content":[]}'),
    identity,
    requestBody: request,
  });
  const sent = server.received.at(-1)!.body as { phase: string; context: { recent_messages: unknown[] } };
  t.equal(sent.phase, 'response');
  t.same(sent.context.recent_messages, [
    { role: 'user', content: 'hi' },
    { role: 'assistant', content: [{ type: 'text', text: 'yo' }] },
  ]);
});

t.test('defaults: timeout 5000 ms, severity warn, phases off', async (t) => {
  const s = validateSidecar({ name: 'a', url: 'http://127.0.0.1:1/x' }, 's');
  t.same(
    [s.timeout_ms, s.severity, s.on_request, s.on_response, s.async, s.include_context],
    [5000, 'warn', false, false, false, false],
  );
});

t.test('every fault is a SidecarError with its reason', async (t) => {
  const cases: [string, Record<string, unknown>, string][] = [
    ['/hang', { timeout_ms: 200 }, 'timeout'],
    ['/error', {}, 'status'],
    ['/garbage', {}, 'bad_json'],
    ['/no-findings', {}, 'bad_json'],
    ['/huge', {}, 'too_large'],
  ];
  for (const [path, extra, reason] of cases) {
    const started = Date.now();
    const err = await callSidecar({ sidecar: sidecar(path, extra), phase: 'request', body: request, identity }).catch(
      (e) => e,
    );
    t.ok(err instanceof SidecarError, `${path} fails`);
    t.equal(err.reason, reason, `${path}: ${reason}`);
    if (path === '/hang') t.ok(Date.now() - started < 3000, 'the timeout cuts it');
    // What a malformed answer said never reaches the error (nor the log line that carries it).
    if (path === '/garbage') t.equal(err.cause, undefined, 'no cause quoting the answer');
  }
  const down = validateSidecar({ name: 'down', url: 'http://127.0.0.1:9/x' }, 's');
  t.equal(
    (await callSidecar({ sidecar: down, phase: 'request', body: request, identity }).catch((e) => e)).reason,
    'network',
  );
  t.equal(MAX_SIDECAR_RESPONSE_BYTES, 1024 * 1024);
});
