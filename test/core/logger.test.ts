import t from 'tap';
import { createLogger } from '../../core/logger.ts';
import { StdoutAuditSink } from '../../audit-wal/stdout-sink.ts';

function capture() {
  const lines: string[] = [];
  return { lines, destination: { write: (s: string) => void lines.push(s) } };
}

t.test('app lines carry stream=app, audit lines stream=audit', async (t) => {
  const app = capture();
  const audit = capture();
  createLogger({ destination: app.destination, component: 'llmproxy' }).info({ a: 1 }, 'hello');
  await new StdoutAuditSink(audit.destination).append('audit_events', { action: 'inference.request' });
  const a = JSON.parse(app.lines[0]);
  t.equal(a.stream, 'app');
  t.equal(a.component, 'llmproxy');
  t.equal(a.level, 'info');
  t.equal(a.msg, 'hello');
  t.equal(JSON.parse(audit.lines[0]).stream, 'audit');
});

t.test('levels filter and secret-looking fields are redacted', async (t) => {
  const c = capture();
  const log = createLogger({ destination: c.destination, level: 'warn' });
  log.info('dropped');
  log.warn({ secret: 'hunter2hunter2', headers: { authorization: 'Bearer abc' } }, 'kept');
  t.equal(c.lines.length, 1);
  t.notMatch(c.lines[0], /hunter2|Bearer abc/);
});

t.test('text format prints one human line', async (t) => {
  const c = capture();
  createLogger({ destination: c.destination, format: 'text' }).warn({ phase: 'request' }, 'inspection failopen');
  t.match(c.lines[0], /^\S+ WARN \[app\] inspection failopen phase=request\n$/);
});
