import t from 'tap';
import { compilePlan } from '../../pipeline/plan.ts';
import { scanBody } from '../../pipeline/scan.ts';
import { sseText } from '../../pipeline/sse-text.ts';
import { policyFromDocument } from '../../pipeline/policy/resolve.ts';
import { validatePolicyDocument } from '../../pipeline/policy/validate.ts';

// A detection corpus through the whole synchronous pipeline: escaped, split and near-miss cases.
const plan = compilePlan(
  policyFromDocument(
    validatePolicyDocument({
      content_inspection: {
        secrets_filter: { enabled: true },
        pii_detection: { enabled: true },
        api_key_detection: { enabled: true },
        patterns: [
          { pattern: 'password\\s*[:=]\\s*\\S{6,}', description: 'password assignment' },
          { pattern: 'say "classified"', description: 'quoted' },
        ],
      },
    }),
  ),
);
const SECRET = 'Tr0ub4dor&3-horse';
const scan = (body: string | Buffer, phase: 'request' | 'response' = 'request') =>
  scanBody(plan, { body: Buffer.isBuffer(body) ? body : Buffer.from(body), phase, secrets: [SECRET] })
    .findings.map((f) => `${f.inspector_type}:${f.match}`)
    .sort();
const json = (content: string) => JSON.stringify({ model: 'm', messages: [{ role: 'user', content }] });

t.test('escapes: content as the JSON carries it', async (t) => {
  t.same(scan(json('line one\nAKIAIOSFODNN7EXAMPLE\nline')), ['api_key:AKIA****'], 'a key right after \\n');
  t.same(scan(json('\n4111111111111111')), ['pii:4111****'], 'a card right after \\n');
  t.same(scan(json('x\n123-45-6789\tz')), ['pii:123-****'], 'an SSN between escapes');
  t.same(scan(json('\nbob@example.com')), ['pii:bob@****'], 'the n of \\n is not part of the address');
  t.same(
    scan(json('\\n4111111111111111')),
    ['pii:4111****'],
    'a backslash-n one level down (tool arguments: JSON in a JSON string) is a newline there',
  );
  t.same(scan('{"c":"mail bob\\u0040example.com"}'), ['pii:bob@****'], '\\u0040');
  t.same(scan('{"c":"\\u0041KIAIOSFODNN7EXAMPLE"}'), ['api_key:AKIA****'], '\\u-escaped first letter');
  t.same(
    scan('{"c":"https:\\/\\/x.test\\/?k=sk-proj-AbCdEfGhIjKlMnOpQrSt1234567890"}'),
    ['api_key:sk-p****'],
    '\\/ escapes',
  );
  t.same(scan(json(`pw ${SECRET}`)), ['secrets:Tr0u****']);
  t.same(
    scan(json('password:\n  hunter22')),
    ['patterns:pass****'],
    'a pattern sees the decoded newline as whitespace',
  );
  t.same(scan(json('they say "classified" here')), ['patterns:say ****'], 'a pattern sees decoded quotes');
  t.same(
    scan(
      Buffer.from(
        json('пароль: 123-45-6789 письмо ivan@example.ru').replace(
          /[\u0400-\u04ff]/g,
          (c) => '\\u' + c.charCodeAt(0).toString(16).padStart(4, '0'),
        ),
      ),
    ),
    ['pii:123-****', 'pii:ivan****'],
    'ensure_ascii bodies',
  );
});

t.test('near misses stay quiet', async (t) => {
  t.same(scan(json('version 1.2.3-45-6789 build 4111111111111112, sk- prefix, ghp_ token, user@host, AKIA')), []);
  t.same(scan(json(`pw ${SECRET.slice(0, -1)}`)), [], 'a secret missing its last character');
  t.same(scan(json('password: short and sweet')), []);
});

const anthropicStream = (deltas: string[]) =>
  [
    'event: message_start',
    `data: ${JSON.stringify({ type: 'message_start', message: { id: 'msg_1', content: [] } })}`,
    '',
    'event: content_block_start',
    `data: ${JSON.stringify({ type: 'content_block_start', index: 0, content_block: { type: 'text', text: '' } })}`,
    '',
    ...deltas.flatMap((text) => [
      'event: content_block_delta',
      `data: ${JSON.stringify({ type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text } })}`,
      '',
    ]),
    'event: message_stop',
    `data: ${JSON.stringify({ type: 'message_stop' })}`,
    '',
    '',
  ].join('\n');

t.test('split: a secret or a pattern spread over stream deltas is found in the response', async (t) => {
  t.same(
    scan(anthropicStream(['your pw is Tr0ub4', 'dor&3-ho', 'rse ok']), 'response'),
    ['secrets:Tr0u****'],
    'anthropic text deltas',
  );
  t.same(scan(anthropicStream(['password', ': hunt', 'er2hunter2']), 'response'), ['patterns:pass****']);
  const openai =
    ['Tr0ub', '4dor&3-', 'horse']
      .map(
        (content) =>
          `data: ${JSON.stringify({ id: 'c', object: 'chat.completion.chunk', choices: [{ index: 0, delta: { content } }] })}\n\n`,
      )
      .join('') + 'data: [DONE]\n\n';
  t.same(scan(openai, 'response'), ['secrets:Tr0u****'], 'openai chat deltas');
  const responses = ['Tr0ub4dor', '&3-horse']
    .map(
      (delta) =>
        `event: response.output_text.delta\ndata: ${JSON.stringify({ type: 'response.output_text.delta', item_id: 'msg_1', output_index: 0, content_index: 0, delta })}\n\n`,
    )
    .join('');
  t.same(scan(responses, 'response'), ['secrets:Tr0u****'], 'openai responses deltas');
  const tool = ['{"cmd": "echo Tr0ub', '4dor&3-horse"}']
    .map(
      (partial_json) =>
        `data: ${JSON.stringify({ type: 'content_block_delta', index: 1, delta: { type: 'input_json_delta', partial_json } })}\n\n`,
    )
    .join('');
  t.same(scan(tool, 'response'), ['secrets:Tr0u****'], 'tool-call argument deltas');
});

t.test('the joined text keeps blocks apart', async (t) => {
  const two = [
    `data: ${JSON.stringify({ type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text: 'Tr0ub4dor' } })}`,
    `data: ${JSON.stringify({ type: 'content_block_delta', index: 1, delta: { type: 'input_json_delta', partial_json: '&3-horse' } })}`,
    `data: ${JSON.stringify({ type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text: ' more' } })}`,
  ].join('\n\n');
  t.equal(sseText(Buffer.from(two))!.toString(), 'Tr0ub4dor more\n&3-horse');
  t.equal(sseText(Buffer.from('{"not":"a stream"}')), null);
});

t.test('OpenAI-compatible reasoning and legacy function_call deltas are joined too', async (t) => {
  const chunk = (delta: Record<string, unknown>) =>
    `data: ${JSON.stringify({ id: 'c', object: 'chat.completion.chunk', choices: [{ index: 0, delta }] })}`;
  const body = [
    chunk({ role: 'assistant', reasoning_content: 'the word is Tr0ub4dor' }),
    chunk({ reasoning_content: '&3-horse, said' }),
    chunk({ reasoning: 'set password = swordf' }),
    chunk({ reasoning: 'ish99' }),
    chunk({ function_call: { name: 'send', arguments: '{"to":"bob\\u0040exa' } }),
    chunk({ function_call: { arguments: 'mple.com"}' } }),
    'data: [DONE]',
  ].join('\n\n');
  t.equal(
    sseText(Buffer.from(body))!.toString(),
    'the word is Tr0ub4dor&3-horse, said\nset password = swordfish99\n{"to":"bob@example.com"}',
    'each field a block of its own; the arguments decoded as JSON',
  );
  t.same(
    scan(body, 'response'),
    ['patterns:pass****', 'secrets:Tr0u****'],
    'the response phase finds what was split across deltas',
  );
});

t.test('escapes two levels deep (JSON inside a JSON string) are decoded too', async (t) => {
  const inner = JSON.stringify({ to: 'x' }).replace('x', 'bob\\u0040example.com');
  const body = JSON.stringify({
    model: 'm',
    messages: [{ role: 'assistant', content: [{ type: 'tool_use', id: 't', name: 'mail', input: { raw: inner } }] }],
  });
  t.ok(body.includes('\\\\u0040'), 'the @ is escaped twice in the body');
  t.same(scan(body), ['pii:bob@****']);
});

t.test('property: the RE2.Set prefilter never hides a built-in finding', async (_t) => {
  const fc = (await import('fast-check')).default;
  const withPatterns = plan;
  const without = compilePlan(
    policyFromDocument(
      validatePolicyDocument({
        content_inspection: { pii_detection: { enabled: true }, api_key_detection: { enabled: true } },
      }),
    ),
  );
  const piece = fc.constantFrom(
    'bob@example.com',
    'x\\u0040y.org',
    '4111 1111 1111 1111',
    '4111-1111-1111-1111',
    '378282246310005',
    '123-45-6789',
    'AKIAIOSFODNN7EXAMPLE',
    'sk-ant-api03-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789',
    'ghp_1234567890abcdefghijklmnopqrstuvwxyz',
    'sk_live_4eC39HqLyjWDarjtT1zdp7dc',
    ' ',
    '\\n',
    '\\t',
    '"',
    'word',
    '12',
    '-',
    '_',
    '@',
    '.',
    'AIza',
    'sk-',
    '\\/',
    // what the normalized view changes: its findings must not depend on the prefilter either
    '＠',
    '&#64;',
    '&commat;',
    '\u200b',
    '\\u200b',
    '４１１１',
    'ＡＫＩＡ',
    '&#x2d;',
    '\u00ad',
    'e\u0301',
  );
  fc.assert(
    fc.property(fc.array(piece, { maxLength: 40 }), (pieces) => {
      const body = Buffer.from(`{"messages":[{"role":"user","content":"${pieces.join('')}"}]}`);
      const keys = (p: typeof plan) =>
        scanBody(p, { body, phase: 'request', secrets: [] })
          .findings.filter((f) => f.inspector_type === 'pii' || f.inspector_type === 'api_key')
          .map((f) => `${f.inspector_type}:${f.description}:${f.match}`)
          .sort();
      return JSON.stringify(keys(withPatterns)) === JSON.stringify(keys(without));
    }),
    { numRuns: 300 },
  );
});

t.test('a secret holding a backslash is found as sent, also when the body has escapes to decode', async (t) => {
  const secret = 'Pa\\ss\\nw0rd!42';
  const found = (body: string) =>
    scanBody(plan, { body: Buffer.from(body), phase: 'request', secrets: [secret] }).findings.map(
      (f) => `${f.inspector_type}:${f.match}`,
    );
  t.same(found(JSON.stringify({ model: 'm', messages: [{ role: 'user', content: `my password is ${secret}` }] })), [
    'secrets:Pa\\s****',
  ]);
  t.same(
    found(
      JSON.stringify({ model: 'm', messages: [{ role: 'user', content: `caf\u00e9 ${secret}` }] }).replace(
        'é',
        '\\u00e9',
      ),
    ),
    ['secrets:Pa\\s****'],
    'with a \\u escape elsewhere',
  );
});
