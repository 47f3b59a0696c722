import { setTimeout as sleep } from 'node:timers/promises';
import fc from 'fast-check';
import t from 'tap';
import { streamToolGate } from '../../../../proxy/llm/tools/stream-formats.ts';
import type { Decide } from '../../../../proxy/llm/tools/types.ts';
import { FORMATS, STREAMS, denyDeletes, manualDecide, through } from './stream-fixtures.ts';

// The tool gate of streamed answers (proxy/llm/tools/stream-gate.ts), in each wire format: what flows,
// what is held and until when, keep-alives, an answer cut mid-call, an agent that leaves, the bound.

const allow: Decide = async () => ({ allow: true, message: '' });
const KEEP_ALIVE: Record<string, string> = {
  'anthropic-messages': 'event: ping\ndata: {"type": "ping"}\n\n',
  'openai-chat': ': keep-alive\n\n',
  'openai-responses': ': keep-alive\n\n',
};

/** Bytes that may be out after `next()` calls that resolve within a few ticks. */
async function drain(gate: ReturnType<typeof streamToolGate>, into: Buffer[]): Promise<void> {
  for (;;) {
    const got = await Promise.race([gate.next(), sleep(5).then(() => undefined)]);
    if (got === undefined || got === null) return;
    into.push(got);
  }
}

for (const format of FORMATS) {
  t.test(`${format}: every call allowed, the answer goes out byte for byte, however it is cut`, async (t) => {
    for (const eol of ['\n', '\r\n']) {
      const bytes = Buffer.from(STREAMS[format](eol));
      const { out, gate } = await through(format, [bytes], allow);
      t.ok(out.equals(bytes), `identical (${JSON.stringify(eol)})`);
      t.same(
        gate.calls.map((c) => [c.state, c.call?.name]),
        [
          ['allowed', 'get_weather'],
          ['allowed', 'delete_files'],
        ],
      );
      for (let i = 0; i <= bytes.length; i++) {
        const cut = await through(format, [bytes.subarray(0, i), bytes.subarray(i)], allow);
        if (!cut.out.equals(bytes)) t.fail(`cut at ${i}`);
      }
    }
  });

  t.test(`${format}: a refused call's rewrite is the same however the stream is cut`, async (t) => {
    const bytes = Buffer.from(STREAMS[format]());
    const { out: whole } = await through(format, [bytes], denyDeletes);
    t.notOk(whole.includes('"delete_files"'), 'the refused call is gone');
    t.ok(whole.includes('was not run: denied by rule.'), 'its message is there');
    for (let i = 0; i <= bytes.length; i++) {
      const { out } = await through(format, [bytes.subarray(0, i), bytes.subarray(i)], denyDeletes);
      if (!out.equals(whole)) t.fail(`cut at ${i}`);
    }
    await fc.assert(
      fc.asyncProperty(fc.array(fc.nat(bytes.length), { maxLength: 12 }), async (cuts) => {
        const at = [...new Set(cuts)].sort((a, b) => a - b);
        const chunks = [...at, bytes.length].map((c, i) => bytes.subarray(i === 0 ? 0 : at[i - 1], c));
        const { out } = await through(format, chunks, denyDeletes);
        return out.equals(whole);
      }),
      { numRuns: 100 },
    );
  });

  t.test(
    `${format}: text before a held call goes out before its decision; parallel calls decided at once`,
    async (t) => {
      const bytes = Buffer.from(STREAMS[format]());
      const firstCall = bytes.indexOf('get_weather');
      const m = manualDecide();
      const gate = streamToolGate(format, m.decide);
      const out: Buffer[] = [];
      gate.push(bytes.subarray(0, firstCall));
      await drain(gate, out);
      const before = Buffer.concat(out).toString();
      t.match(before, /Checking\./, 'the text is out');
      t.equal(m.seen.length, 0, 'with no decision yet');
      gate.push(bytes.subarray(firstCall));
      gate.end();
      await drain(gate, out);
      t.same(
        m.seen.map((c) => c.name),
        ['get_weather', 'delete_files'],
        'both calls are being decided, neither waiting for the other',
      );
      t.equal(Buffer.concat(out).toString(), before, 'nothing from the first call on is out');
      m.settle(1, { allow: false, message: 'no deleting' });
      await drain(gate, out);
      t.equal(Buffer.concat(out).toString(), before, 'the second decision alone releases nothing: order is kept');
      m.settle(0, { allow: true, message: '' });
      const rest: Buffer[] = [];
      for (let b = await gate.next(); b !== null; b = await gate.next()) rest.push(b);
      const all = before + Buffer.concat(rest).toString();
      t.ok(all.indexOf('get_weather') < all.indexOf('no deleting'), 'released in order');
      t.match(all, /no deleting/);
      t.notMatch(all, /delete_files"/);
      t.same(
        m.seen.map((c) => c.arguments),
        ['{"city":"Paris"}', '{"path":"/"}'],
        'decided on the joined arguments',
      );
      t.same(
        m.seen.map((c) => c.seq),
        [0, 1],
      );
    },
  );

  t.test(`${format}: while held, the stream is kept alive in its own terms, and only then`, async (t) => {
    const bytes = Buffer.from(STREAMS[format]());
    const m = manualDecide();
    const gate = streamToolGate(format, m.decide, { keepAliveMs: 20 });
    const out: Buffer[] = [];
    gate.push(bytes.subarray(0, bytes.indexOf('get_weather')));
    await sleep(70);
    await drain(gate, out);
    t.notOk(Buffer.concat(out).includes(KEEP_ALIVE[format]), 'no keep-alive while nothing is held');
    gate.push(bytes.subarray(bytes.indexOf('get_weather')));
    gate.end();
    await sleep(90);
    await drain(gate, out);
    const held = Buffer.concat(out).toString();
    const pings = held.split(KEEP_ALIVE[format]).length - 1;
    t.ok(pings >= 2, `keep-alives while held (${pings})`);
    t.ok(held.endsWith(KEEP_ALIVE[format]), 'between whole events');
    m.settle(0, { allow: true, message: '' });
    m.settle(1, { allow: true, message: '' });
    for (let b = await gate.next(); b !== null; b = await gate.next()) out.push(b);
    const done = Buffer.concat(out).length;
    await sleep(60);
    t.equal(await Promise.race([gate.next(), sleep(5).then(() => 'pending')]), null, 'nothing more, the gate is done');
    t.equal(Buffer.concat(out).length, done);
    // Everything but the keep-alives is the upstream's answer, byte for byte.
    t.equal(Buffer.concat(out).toString().split(KEEP_ALIVE[format]).join(''), bytes.toString());
  });

  t.test(`${format}: an answer that ends mid-call never delivers that call`, async (t) => {
    const bytes = Buffer.from(STREAMS[format]());
    const cut = bytes.indexOf('{\\"path') + 4;
    const m = manualDecide();
    const gate = streamToolGate(format, m.decide);
    gate.push(bytes.subarray(0, cut));
    gate.end();
    t.same(
      m.seen.map((c) => c.name),
      ['get_weather'],
      'the incomplete call is never decided',
    );
    m.settle(0, { allow: true, message: '' });
    const out: Buffer[] = [];
    for (let b = await gate.next(); b !== null; b = await gate.next()) out.push(b);
    const text = Buffer.concat(out).toString();
    t.match(text, /get_weather/);
    t.notMatch(text, /delete_files/, 'nothing of the cut call goes out');
    t.same(
      gate.calls.map((c) => c.state),
      ['allowed', 'dropped'],
    );
  });

  t.test(`${format}: cancel (the agent left) stops everything and leaks no timer`, async (t) => {
    const bytes = Buffer.from(STREAMS[format]());
    const m = manualDecide();
    const timers = () => process.getActiveResourcesInfo().filter((r) => r === 'Timeout').length;
    await sleep(10); // the timers of earlier tests are done
    const before = timers();
    const gate = streamToolGate(format, m.decide, { keepAliveMs: 10 });
    gate.push(bytes.subarray(0, bytes.indexOf('delete_files')));
    t.ok(timers() > before, 'a keep-alive timer runs while held');
    const waiting = (async () => {
      const out: Buffer[] = [];
      for (let b = await gate.next(); b !== null; b = await gate.next()) out.push(b);
      return Buffer.concat(out);
    })();
    await sleep(15);
    const decided = m.seen.length;
    gate.cancel();
    const got = await waiting;
    t.notMatch(got.toString(), /get_weather/, 'the held call never went out');
    t.equal(timers(), before, 'no timer left');
    gate.push(bytes.subarray(bytes.indexOf('delete_files')));
    gate.end();
    t.equal(m.seen.length, decided, 'decide is never called again');
    if (decided > 0) m.settle(0, { allow: true, message: '' });
    await sleep(5);
    t.equal(await gate.next(), null, 'and a late verdict releases nothing');
  });

  t.test(`${format}: past the bound, undecided calls are refused and the gate ends`, async (t) => {
    const bytes = Buffer.from(STREAMS[format]());
    const m = manualDecide();
    const firstCall = bytes.indexOf('get_weather');
    const gate = streamToolGate(format, m.decide, { maxHeldBytes: bytes.length - firstCall - 40 });
    const out: Buffer[] = [];
    const reading = (async () => {
      for (let b = await gate.next(); b !== null; b = await gate.next()) out.push(b);
    })();
    for (let i = 0; i < bytes.length; i += 16) gate.push(bytes.subarray(i, i + 16));
    t.ok(gate.overflowed, 'overflowed');
    await reading;
    const text = Buffer.concat(out).toString();
    t.match(text, /get_weather \(id call_1|get_weather \(id toolu_1/, 'the undecided call is refused with a message');
    t.match(text, /exceeded \d+ bytes/);
    t.notMatch(text, /"delete_files"/, 'the call cut by the bound is dropped');
    t.equal(gate.calls[0].state, 'refused');
    m.settle(0, { allow: true, message: '' });
    await sleep(1);
    t.equal(gate.calls[0].state, 'refused', 'a verdict arriving after is ignored');
  });

  t.test(`${format}: a decision that throws or rejects refuses the call`, async (t) => {
    const bytes = Buffer.from(STREAMS[format]());
    let n = 0;
    const broken: Decide = (call) => {
      if (n++ === 0) throw new Error('boom');
      return Promise.reject(new Error(`no ${call.name}`));
    };
    const { out, gate } = await through(format, [bytes], broken);
    t.same(
      gate.calls.map((c) => c.state),
      ['refused', 'refused'],
    );
    t.match(out.toString(), /get_weather \(id [a-z_0-9]+\) was not run: its decision failed\./);
  });

  t.test(`${format}: unreadable events pass untouched, and are held in order inside a held stretch`, async (t) => {
    const bytes = Buffer.from(STREAMS[format]());
    const junk = 'event: junk\ndata: {not json\n\n: comment\n\n';
    const at = bytes.indexOf(format === 'openai-chat' ? 'data: {"id"' : 'event: ', 10);
    const callAt = bytes.lastIndexOf('\n\n', bytes.indexOf('delete_files')) + 2;
    const withJunk = Buffer.concat([
      bytes.subarray(0, at),
      Buffer.from(junk),
      bytes.subarray(at, callAt),
      Buffer.from(junk),
      bytes.subarray(callAt),
    ]);
    const { out } = await through(format, [withJunk], allow);
    t.ok(out.equals(withJunk), 'in order, byte for byte');
  });
}

t.test('a Decide breaking its contract cannot crash the gate or let a call through', async (t) => {
  const bytes = Buffer.from(STREAMS['anthropic-messages']());
  const odd = [
    (() => ({ allow: true, message: '' })) as unknown as Decide, // not a promise: still honoured
    (async () => null) as unknown as Decide,
    (async () => ({ allow: 'yes', message: '' })) as unknown as Decide,
    (async () => ({ allow: false })) as unknown as Decide,
  ];
  const states = [];
  for (const decide of odd) {
    const { gate, out } = await through('anthropic-messages', [bytes], decide);
    states.push(gate.calls[0].state);
    if (gate.calls[0].state === 'refused')
      t.match(out.toString(), /get_weather \(id toolu_1\) was not run: refused by policy/);
  }
  t.same(states, ['allowed', 'refused', 'refused', 'refused']);
});
