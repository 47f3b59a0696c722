import { randomUUID } from 'node:crypto';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { parseAddr } from '../../core/addr.ts';

// `dvx dev --upstream mock`: a local model upstream so the first call answers 200 with no provider key
// and no network. It speaks the three wire formats llmproxy relays (Anthropic Messages, OpenAI Chat
// Completions and Responses), plain and streamed, and says what it is in every answer: the text starts
// with MOCK_LABEL and the model is echoed, so no one mistakes it for a real model. It answers with the
// last user text it was sent, which shows what reached the upstream after llmproxy's inspection.

export const MOCK_LABEL = '[dvx dev mock upstream]';
const MAX_BODY = 8 * 1024 * 1024;

export interface MockUpstream {
  url: string;
  close(): Promise<void>;
}

type Json = Record<string, unknown>;

/** The text of the last user message, whatever the format (string content or content parts). */
function lastUserText(body: Json): string {
  const text = (content: unknown): string =>
    typeof content === 'string'
      ? content
      : Array.isArray(content)
        ? content
            .map((p) => (p && typeof p === 'object' && typeof (p as Json).text === 'string' ? (p as Json).text : ''))
            .join('')
        : '';
  const messages = Array.isArray(body.messages) ? body.messages : Array.isArray(body.input) ? body.input : null;
  if (typeof body.input === 'string') return body.input;
  for (const m of [...(messages ?? [])].reverse())
    if (m && typeof m === 'object' && (m as Json).role === 'user') return text((m as Json).content);
  return '';
}

function replyFor(body: Json): string {
  const asked = lastUserText(body).replace(/\s+/g, ' ').trim().slice(0, 200);
  return `${MOCK_LABEL} This is a local stand-in, not a model. You said: "${asked}"`;
}

/** The reply cut in word-sized pieces for a stream. */
const pieces = (text: string) => text.split(/(?<= )/);

function sse(res: http.ServerResponse, events: [string | null, unknown][], done = false): void {
  res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
  for (const [name, data] of events)
    res.write(`${name ? `event: ${name}\n` : ''}data: ${typeof data === 'string' ? data : JSON.stringify(data)}\n\n`);
  if (done) res.write('data: [DONE]\n\n');
  res.end();
}

function json(res: http.ServerResponse, status: number, body: unknown): void {
  res.writeHead(status, { 'content-type': 'application/json' });
  res.end(JSON.stringify(body));
}

function anthropic(body: Json, res: http.ServerResponse): void {
  const model = String(body.model ?? 'mock');
  const text = replyFor(body);
  const id = `msg_dev_${randomUUID().replaceAll('-', '')}`;
  const usage = { input_tokens: 10, output_tokens: pieces(text).length };
  if (!body.stream) {
    json(res, 200, {
      id,
      type: 'message',
      role: 'assistant',
      model,
      content: [{ type: 'text', text }],
      stop_reason: 'end_turn',
      stop_sequence: null,
      usage,
    });
    return;
  }
  sse(res, [
    [
      'message_start',
      {
        type: 'message_start',
        message: {
          id,
          type: 'message',
          role: 'assistant',
          model,
          content: [],
          stop_reason: null,
          stop_sequence: null,
          usage: { input_tokens: 10, output_tokens: 1 },
        },
      },
    ],
    ['content_block_start', { type: 'content_block_start', index: 0, content_block: { type: 'text', text: '' } }],
    ...pieces(text).map((t): [string, unknown] => [
      'content_block_delta',
      { type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text: t } },
    ]),
    ['content_block_stop', { type: 'content_block_stop', index: 0 }],
    [
      'message_delta',
      {
        type: 'message_delta',
        delta: { stop_reason: 'end_turn', stop_sequence: null },
        usage: { output_tokens: usage.output_tokens },
      },
    ],
    ['message_stop', { type: 'message_stop' }],
  ]);
}

function openaiChat(body: Json, res: http.ServerResponse): void {
  const model = String(body.model ?? 'mock');
  const text = replyFor(body);
  const id = `chatcmpl-dev-${randomUUID()}`;
  const created = Math.floor(Date.now() / 1000);
  const usage = { prompt_tokens: 10, completion_tokens: pieces(text).length, total_tokens: 10 + pieces(text).length };
  if (!body.stream) {
    json(res, 200, {
      id,
      object: 'chat.completion',
      created,
      model,
      choices: [{ index: 0, message: { role: 'assistant', content: text }, finish_reason: 'stop', logprobs: null }],
      usage,
    });
    return;
  }
  const chunk = (delta: Json, finish: string | null) => ({
    id,
    object: 'chat.completion.chunk',
    created,
    model,
    choices: [{ index: 0, delta, finish_reason: finish, logprobs: null }],
  });
  const wantsUsage = (body.stream_options as Json | undefined)?.include_usage === true;
  sse(
    res,
    [
      [null, chunk({ role: 'assistant', content: '' }, null)],
      ...pieces(text).map((t): [null, unknown] => [null, chunk({ content: t }, null)]),
      [null, chunk({}, 'stop')],
      ...(wantsUsage
        ? [[null, { id, object: 'chat.completion.chunk', created, model, choices: [], usage }] as [null, unknown]]
        : []),
    ],
    true,
  );
}

function openaiResponses(body: Json, res: http.ServerResponse): void {
  const model = String(body.model ?? 'mock');
  const text = replyFor(body);
  const id = `resp_dev_${randomUUID().replaceAll('-', '')}`;
  const message = {
    id: `msg_dev_${randomUUID().replaceAll('-', '')}`,
    type: 'message',
    status: 'completed',
    role: 'assistant',
    content: [{ type: 'output_text', text, annotations: [] }],
  };
  const response = {
    id,
    object: 'response',
    created_at: Math.floor(Date.now() / 1000),
    status: 'completed',
    model,
    output: [message],
    usage: { input_tokens: 10, output_tokens: pieces(text).length, total_tokens: 10 + pieces(text).length },
  };
  if (!body.stream) {
    json(res, 200, response);
    return;
  }
  let seq = 0;
  const ev = (type: string, fields: Json): [string, unknown] => [type, { type, sequence_number: seq++, ...fields }];
  const pending = { ...response, status: 'in_progress', output: [], usage: null };
  const part = { type: 'output_text', text: '', annotations: [] };
  const at = { item_id: message.id, output_index: 0, content_index: 0 };
  sse(res, [
    ev('response.created', { response: pending }),
    ev('response.in_progress', { response: pending }),
    ev('response.output_item.added', { output_index: 0, item: { ...message, status: 'in_progress', content: [] } }),
    ev('response.content_part.added', { ...at, part }),
    ...pieces(text).map((delta) => ev('response.output_text.delta', { ...at, delta })),
    ev('response.output_text.done', { ...at, text }),
    ev('response.content_part.done', { ...at, part: { ...part, text } }),
    ev('response.output_item.done', { output_index: 0, item: message }),
    ev('response.completed', { response }),
  ]);
}

function route(req: http.IncomingMessage, res: http.ServerResponse, body: Json): void {
  const path = (req.url ?? '/').split('?')[0];
  if (req.method === 'GET' && (path === '/v1/models' || path === '/models')) {
    json(res, 200, {
      object: 'list',
      data: [{ id: 'dvx-dev-mock', object: 'model', type: 'model', display_name: `dvx-dev-mock ${MOCK_LABEL}` }],
    });
    return;
  }
  if (req.method === 'POST' && path.endsWith('/messages')) anthropic(body, res);
  else if (req.method === 'POST' && path.endsWith('/chat/completions')) openaiChat(body, res);
  else if (req.method === 'POST' && path.endsWith('/responses')) openaiResponses(body, res);
  else
    json(res, 404, {
      type: 'error',
      error: { type: 'not_found_error', message: `${MOCK_LABEL} no such route: ${req.method} ${path}` },
    });
}

/** Starts the mock upstream on `addr` (plain http on loopback: llmproxy is its only client). */
export async function startMockUpstream(addr: string): Promise<MockUpstream> {
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    let size = 0;
    req.on('data', (c: Buffer) => {
      size += c.length;
      if (size > MAX_BODY) req.destroy();
      else chunks.push(c);
    });
    req.on('end', () => {
      let body: Json = {};
      const raw = Buffer.concat(chunks).toString('utf8');
      if (raw) {
        try {
          const parsed = JSON.parse(raw) as unknown;
          if (parsed && typeof parsed === 'object' && !Array.isArray(parsed)) body = parsed as Json;
        } catch {
          json(res, 400, {
            type: 'error',
            error: { type: 'invalid_request_error', message: `${MOCK_LABEL} the body is not JSON` },
          });
          return;
        }
      }
      route(req, res, body);
    });
  });
  const { host, port } = parseAddr(addr);
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host || '127.0.0.1', () => resolve());
  });
  const bound = (server.address() as AddressInfo).port;
  return {
    url: `http://${host && host !== '0.0.0.0' ? host : '127.0.0.1'}:${bound}`,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}
