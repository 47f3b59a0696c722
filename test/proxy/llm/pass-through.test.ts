import t from 'tap';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI, { toFile } from 'openai';
import { AGENT_SECRET, baseSnapshot, startHarness } from '../../fixtures/llmproxy-harness.ts';

// The providers' other routes carry content too: embeddings, count_tokens, message batches, file
// uploads. Their bodies go through the request pipeline like an inference call's, and model
// restriction checks every model they name, so none of them is a way around policy.

type Snapshot = ReturnType<typeof baseSnapshot> & {
  platform: Record<string, unknown>;
  orgs: Record<string, { flags: Record<string, boolean> }>;
};

const h = await startHarness({
  snapshot: (url) => {
    const s = baseSnapshot(url) as Snapshot;
    s.platform.model_policy = { value: { mode: 'blocklist', models: ['claude-opus-*', 'text-embedding-3-large'] } };
    return s;
  },
});
t.teardown(() => h.close());

const received = () => h.upstream.received.length;
const lastAudit = () => h.audit.at(-1)!;
const policyError = {
  type: 'error',
  error: { type: 'content_policy_violation', message: 'Request blocked by content security policy.' },
};

t.test('embeddings: a secret in the input is blocked, a clean call passes and is audited', async (t) => {
  const client = h.openai(await h.token());
  const before = received();
  const err = await client.embeddings
    .create({ model: 'text-embedding-3-small', input: `the db password is ${AGENT_SECRET}` })
    .catch((e) => e);
  t.ok(err instanceof OpenAI.PermissionDeniedError, 'PermissionDeniedError through the SDK');
  t.same(err.error, policyError.error, "the spec's generic body");
  t.equal(received(), before, 'nothing reached the upstream');
  t.match(lastAudit(), {
    path: '/v1/embeddings',
    status: 403,
    decision: 'block',
    findings: [{ inspector_type: 'secrets', severity: 'block' }],
  });
  t.notOk(JSON.stringify(h.audit).includes(AGENT_SECRET), 'the secret is in no audit record');

  const ok = await client.embeddings.create({ model: 'text-embedding-3-small', input: 'hello world' });
  t.equal(ok.data.length, 1);
  t.equal(received(), before + 1);
  t.match(lastAudit(), { path: '/v1/embeddings', status: 200, model: 'text-embedding-3-small', decision: 'allow' });
});

t.test('embeddings: a blocklisted model is refused, however the key is spelt', async (t) => {
  const client = h.openai(await h.token());
  const err = await client.embeddings.create({ model: 'text-embedding-3-large', input: 'hi' }).catch((e) => e);
  t.ok(err instanceof OpenAI.PermissionDeniedError);
  t.match(lastAudit(), { status: 403, findings: [{ inspector_type: 'model_restriction', severity: 'block' }] });
  const before = received();
  const escaped = await h.call('/v1/embeddings', {
    method: 'POST',
    headers: { authorization: `Bearer ${await h.token()}`, 'content-type': 'application/json' },
    body: '{"mod\\u0065l":"text-embedding-3-large","input":"hi"}',
  });
  t.equal(escaped.status, 403, 'an escaped key names the model all the same');
  t.equal(received(), before);
});

t.test('model restriction reads every form a model can take; a form it cannot read is refused', async (t) => {
  const auth = { authorization: `Bearer ${await h.token()}` };
  const before = received();
  const form = `--B\r\nContent-Disposition: form-data; name="model"\r\n\r\ntext-embedding-3-large\r\n--B\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\nContent-Type: audio/wav\r\n\r\nRIFF....\r\n--B--\r\n`;
  const audio = await h.call('/v1/audio/transcriptions', {
    headers: { ...auth, 'content-type': 'multipart/form-data; boundary=B' },
    body: form,
  });
  t.equal(audio.status, 403, 'a multipart model field');
  const nan = await h.call('/v1/embeddings', {
    headers: { ...auth, 'content-type': 'application/json' },
    body: '{"model":"text-embedding-3-small","input":"x","dimensions":NaN}',
  });
  t.equal(nan.status, 403, 'JSON a Python upstream reads and we cannot');
  t.match(lastAudit(), {
    status: 403,
    findings: [{ inspector_type: 'model_restriction', description: /cannot read/ }],
  });
  const upper = await h.call('/v1/embeddings', {
    headers: { ...auth, 'content-type': 'application/json' },
    body: '{"model":"text-embedding-3-small","Model":"text-embedding-3-large","input":"x"}',
  });
  t.equal(upper.status, 403, 'a key in another case, which Go decoders take for the same field');
  t.equal(received(), before, 'none reached the upstream');
  const pdf = await h.call('/v1/files', {
    headers: { ...auth, 'content-type': 'multipart/form-data; boundary=B' },
    body: Buffer.concat([
      Buffer.from(
        '--B\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nassistants\r\n--B\r\nContent-Disposition: form-data; name="file"; filename="a.pdf"\r\n\r\n%PDF',
      ),
      Buffer.from([0xff, 0xfe, 0x00]),
      Buffer.from('\r\n--B--\r\n'),
    ]),
  });
  t.equal(pdf.status, 200, 'a binary upload names no model and passes');
});

t.test('count_tokens: an API key in a message is blocked; a clean count passes', async (t) => {
  const client = h.anthropic(await h.token());
  const before = received();
  const err = await client.messages
    .countTokens({ model: 'claude-sonnet-4-5', messages: [{ role: 'user', content: 'key AKIAIOSFODNN7EXAMPLE' }] })
    .catch((e) => e);
  t.ok(err instanceof Anthropic.PermissionDeniedError);
  t.same(err.error, policyError);
  t.equal(received(), before);
  const count = await client.messages.countTokens({
    model: 'claude-sonnet-4-5',
    messages: [{ role: 'user', content: 'hi' }],
  });
  t.equal(count.input_tokens, 42);
  t.equal(h.upstream.received.at(-1)!.path, '/v1/messages/count_tokens');
});

t.test('message batches: every model a batch names must be permitted; content is inspected', async (t) => {
  const client = h.anthropic(await h.token());
  const request = (id: string, model: string, content: string) => ({
    custom_id: id,
    params: { model, max_tokens: 8, messages: [{ role: 'user' as const, content }] },
  });
  const before = received();
  const err = await client.messages.batches
    .create({ requests: [request('a', 'claude-sonnet-4-5', 'hi'), request('b', 'claude-opus-4', 'hi')] })
    .catch((e) => e);
  t.ok(err instanceof Anthropic.PermissionDeniedError, 'a blocklisted model inside the batch');
  t.match(lastAudit(), {
    path: '/v1/messages/batches',
    status: 403,
    findings: [{ inspector_type: 'model_restriction', match: 'clau****' }],
  });
  const leak = await client.messages.batches
    .create({ requests: [request('a', 'claude-sonnet-4-5', `pw ${AGENT_SECRET}`)] })
    .catch((e) => e);
  t.ok(leak instanceof Anthropic.PermissionDeniedError, 'a secret inside the batch');
  t.equal(received(), before, 'neither reached the upstream');
  const batch = await client.messages.batches.create({
    requests: [request('a', 'claude-sonnet-4-5', 'hi'), request('b', 'claude-haiku-4-5', 'hi')],
  });
  t.equal(batch.id, 'msgbatch_1');
  t.equal(received(), before + 1);
});

t.test(
  'file uploads (multipart): a batch input file is read line by line; a secret in any file is blocked',
  async (t) => {
    const client = h.openai(await h.token());
    const line = (model: string) =>
      JSON.stringify({ custom_id: model, method: 'POST', url: '/v1/embeddings', body: { model, input: 'hi' } });
    const before = received();
    const blocked = await client.files
      .create({
        purpose: 'batch',
        file: await toFile(
          Buffer.from(`${line('text-embedding-3-small')}\n${line('text-embedding-3-large')}\n`),
          'batch.jsonl',
        ),
      })
      .catch((e) => e);
    t.ok(blocked instanceof OpenAI.PermissionDeniedError, 'a blocklisted model on one line of the file');
    const leak = await client.files
      .create({
        purpose: 'assistants',
        file: await toFile(Buffer.from(`notes\npassword: ${AGENT_SECRET}\n`), 'notes.txt'),
      })
      .catch((e) => e);
    t.ok(leak instanceof OpenAI.PermissionDeniedError, 'a secret in a plain text file');
    t.equal(received(), before);
    const file = await client.files.create({
      purpose: 'batch',
      file: await toFile(Buffer.from(`${line('text-embedding-3-small')}\n`), 'batch.jsonl'),
    });
    t.equal(file.id, 'file-1');
    t.match(String(h.upstream.received.at(-1)!.headers['content-type']), /^multipart\/form-data/);
  },
);

t.test('a body-less call (GET /v1/models) is not inspected; with inspect:llm off nothing is', async (t) => {
  const client = h.anthropic(await h.token());
  const models = await client.models.list();
  t.equal(models.data[0].id, 'claude-sonnet-4-5');
  t.match(lastAudit(), { path: '/v1/models', status: 200, findings: [] });

  const snapshot = baseSnapshot(h.upstream.url) as Snapshot;
  snapshot.platform.model_policy = { value: { mode: 'blocklist', models: ['text-embedding-3-large'] } };
  snapshot.orgs['org-1'].flags = { 'inspect:llm': false };
  await h.writeSnapshot(snapshot);
  const openai = h.openai(await h.token());
  const out = await openai.embeddings.create({ model: 'text-embedding-3-large', input: `pw ${AGENT_SECRET}` });
  t.equal(out.data.length, 1, 'the org turned inspection off: forwarded as is');
  t.match(lastAudit(), { path: '/v1/embeddings', status: 200, findings: [] });
});
