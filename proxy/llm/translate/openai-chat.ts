import { TranslationError } from '../errors.ts';
import { formatSse } from '../../../core/sse.ts';
import { own } from '../../../core/own.ts';
import {
  DEFAULT_MAX_TOKENS,
  mergeRoles,
  parseArguments,
  syntheticId,
  textOf,
  type CBlock,
  type CEvent,
  type CMessage,
  type CRequest,
  type CResponse,
  type CStopReason,
  type CToolChoice,
} from './canonical.ts';

// openai-chat (`/v1/chat/completions`) ⇄ canonical.

type Obj = Record<string, unknown>;

function partsToBlocks(content: unknown): CBlock[] {
  if (content === null || content === undefined) return [];
  if (typeof content === 'string') return content === '' ? [] : [{ type: 'text', text: content }];
  if (!Array.isArray(content)) throw new TranslationError('message content must be a string or an array of parts');
  return (content as Obj[]).map((p): CBlock => {
    if (p.type === 'text') return { type: 'text', text: String(p.text ?? '') };
    if (p.type === 'image_url') {
      const url = String((p.image_url as Obj | undefined)?.url ?? '');
      const m = /^data:([^;]+);base64,(.*)$/s.exec(url);
      return m
        ? { type: 'image', source: { type: 'base64', media_type: m[1], data: m[2] } }
        : { type: 'image', source: { type: 'url', url } };
    }
    throw new TranslationError(`content part type "${String(p.type)}" cannot be translated`);
  });
}

const CHOICE_IN: Record<string, CToolChoice> = {
  auto: { type: 'auto' },
  none: { type: 'none' },
  required: { type: 'any' },
};

export function requestToCanonical(body: Obj): CRequest {
  if (!Array.isArray(body.messages)) throw new TranslationError('messages must be an array');
  const system: string[] = [];
  const messages: CMessage[] = [];
  for (const m of body.messages as Obj[]) {
    if (m.role === 'system' || m.role === 'developer') system.push(textOf(partsToBlocks(m.content)));
    else if (m.role === 'user') messages.push({ role: 'user', content: partsToBlocks(m.content) });
    else if (m.role === 'assistant') {
      const content = partsToBlocks(m.content);
      for (const call of (m.tool_calls ?? []) as Obj[]) {
        const fn = (call.function ?? {}) as Obj;
        content.push({
          type: 'tool_use',
          id: String(call.id),
          name: String(fn.name),
          input: parseArguments(fn.arguments),
        });
      }
      messages.push({ role: 'assistant', content });
    } else if (m.role === 'tool') {
      messages.push({
        role: 'user',
        content: [
          { type: 'tool_result', tool_use_id: String(m.tool_call_id), content: textOf(partsToBlocks(m.content)) },
        ],
      });
    } else throw new TranslationError(`message role "${String(m.role)}" cannot be translated`);
  }
  const req: CRequest = {
    model: String(body.model ?? ''),
    messages: mergeRoles(messages),
    max_tokens: Number(body.max_completion_tokens ?? body.max_tokens ?? DEFAULT_MAX_TOKENS),
  };
  if (system.length > 0) req.system = system.join('\n\n');
  if (typeof body.temperature === 'number') req.temperature = body.temperature;
  if (typeof body.top_p === 'number') req.top_p = body.top_p;
  if (body.stop !== undefined && body.stop !== null)
    req.stop_sequences = Array.isArray(body.stop) ? (body.stop as string[]) : [String(body.stop)];
  if (body.stream === true) req.stream = true;
  if (Array.isArray(body.tools)) {
    req.tools = (body.tools as Obj[]).map((t) => {
      const fn = (t.function ?? {}) as Obj;
      return {
        name: String(fn.name),
        ...(fn.description ? { description: String(fn.description) } : {}),
        input_schema: fn.parameters ?? { type: 'object', properties: {} },
      };
    });
  }
  const choice = body.tool_choice;
  if (typeof choice === 'string' && own(CHOICE_IN, choice)) req.tool_choice = own(CHOICE_IN, choice);
  else if (choice && typeof choice === 'object')
    req.tool_choice = { type: 'tool', name: String(((choice as Obj).function as Obj)?.name) };
  return req;
}

function blockToPart(b: CBlock): Obj | null {
  if (b.type === 'text') return { type: 'text', text: b.text };
  if (b.type === 'image')
    return {
      type: 'image_url',
      image_url: {
        url: b.source.type === 'base64' ? `data:${b.source.media_type};base64,${b.source.data}` : b.source.url,
      },
    };
  return null;
}

export function requestFromCanonical(req: CRequest): Obj {
  const messages: Obj[] = [];
  if (req.system) messages.push({ role: 'system', content: req.system });
  for (const m of req.messages) {
    if (m.role === 'assistant') {
      const text = m.content
        .filter((b) => b.type === 'text')
        .map((b) => (b as { text: string }).text)
        .join('');
      const calls = m.content
        .filter((b) => b.type === 'tool_use')
        .map((b) => {
          const u = b as Extract<CBlock, { type: 'tool_use' }>;
          return { id: u.id, type: 'function', function: { name: u.name, arguments: JSON.stringify(u.input ?? {}) } };
        });
      messages.push({ role: 'assistant', content: text || null, ...(calls.length ? { tool_calls: calls } : {}) });
      continue;
    }
    // Tool results answer the previous assistant turn, so they come first, as `tool` messages.
    for (const b of m.content)
      if (b.type === 'tool_result')
        messages.push({ role: 'tool', tool_call_id: b.tool_use_id, content: textOf(b.content) });
    const parts = m.content.map(blockToPart).filter((p): p is Obj => p !== null);
    if (parts.length > 0)
      messages.push({
        role: 'user',
        content: parts.every((p) => p.type === 'text') ? parts.map((p) => p.text).join('') : parts,
      });
  }
  const out: Obj = { model: req.model, messages, max_tokens: req.max_tokens };
  if (req.temperature !== undefined) out.temperature = req.temperature;
  if (req.top_p !== undefined) out.top_p = req.top_p;
  if (req.stop_sequences) out.stop = req.stop_sequences;
  if (req.stream) {
    out.stream = true;
    out.stream_options = { include_usage: true };
  }
  if (req.tools)
    out.tools = req.tools.map((t) => ({
      type: 'function',
      function: { name: t.name, ...(t.description ? { description: t.description } : {}), parameters: t.input_schema },
    }));
  if (req.tool_choice) {
    const c = req.tool_choice;
    out.tool_choice =
      c.type === 'auto'
        ? 'auto'
        : c.type === 'none'
          ? 'none'
          : c.type === 'any'
            ? 'required'
            : { type: 'function', function: { name: c.name } };
  }
  return out;
}

const FINISH_IN: Record<string, CStopReason> = {
  stop: 'end_turn',
  length: 'max_tokens',
  tool_calls: 'tool_use',
  function_call: 'tool_use',
  content_filter: 'refusal',
};
const FINISH_OUT: Record<string, string> = {
  end_turn: 'stop',
  stop_sequence: 'stop',
  max_tokens: 'length',
  tool_use: 'tool_calls',
  refusal: 'content_filter',
  pause_turn: 'stop',
};

export function responseToCanonical(body: Obj): CResponse {
  const choice = ((body.choices ?? []) as Obj[])[0] ?? {};
  const message = (choice.message ?? {}) as Obj;
  const content = partsToBlocks(message.content);
  for (const call of (message.tool_calls ?? []) as Obj[]) {
    const fn = (call.function ?? {}) as Obj;
    content.push({ type: 'tool_use', id: String(call.id), name: String(fn.name), input: parseArguments(fn.arguments) });
  }
  const usage = (body.usage ?? {}) as Obj;
  return {
    id: String(body.id ?? syntheticId('chatcmpl-')),
    model: String(body.model ?? ''),
    content,
    stop_reason: own(FINISH_IN, String(choice.finish_reason)) ?? null,
    usage: { input_tokens: Number(usage.prompt_tokens ?? 0), output_tokens: Number(usage.completion_tokens ?? 0) },
  };
}

export function responseFromCanonical(res: CResponse): Obj {
  const text = res.content
    .filter((b) => b.type === 'text')
    .map((b) => (b as { text: string }).text)
    .join('');
  const calls = res.content
    .filter((b) => b.type === 'tool_use')
    .map((b) => {
      const u = b as Extract<CBlock, { type: 'tool_use' }>;
      return { id: u.id, type: 'function', function: { name: u.name, arguments: JSON.stringify(u.input ?? {}) } };
    });
  return {
    id: res.id.startsWith('chatcmpl-') ? res.id : `chatcmpl-${res.id}`,
    object: 'chat.completion',
    created: Math.floor(Date.now() / 1000),
    model: res.model,
    choices: [
      {
        index: 0,
        message: {
          role: 'assistant',
          content: text || (calls.length ? null : ''),
          refusal: null,
          ...(calls.length ? { tool_calls: calls } : {}),
        },
        finish_reason: own(FINISH_OUT, res.stop_reason ?? 'end_turn') ?? 'stop',
        logprobs: null,
      },
    ],
    usage: {
      prompt_tokens: res.usage.input_tokens,
      completion_tokens: res.usage.output_tokens,
      total_tokens: res.usage.input_tokens + res.usage.output_tokens,
    },
  };
}

/** Upstream chat chunks → canonical events. */
export class ChatParser {
  #started = false;
  #open: { index: number; kind: 'text' | 'tool'; call?: number } | null = null;
  #blocks = 0;
  #toolBlock = new Map<number, number>();
  #stop: CStopReason | null = null;
  #usage = { input_tokens: 0, output_tokens: 0 };
  #done = false;

  parse(_event: string | null, data: string): CEvent[] {
    if (data.trim() === '[DONE]') return this.#finish();
    const chunk = JSON.parse(data) as Obj;
    const out: CEvent[] = [];
    if (!this.#started) {
      this.#started = true;
      out.push({
        type: 'message_start',
        message: {
          id: String(chunk.id ?? syntheticId('msg_')),
          model: String(chunk.model ?? ''),
          usage: { input_tokens: 0, output_tokens: 0 },
        },
      });
    }
    if (chunk.usage && typeof chunk.usage === 'object') {
      const u = chunk.usage as Obj;
      this.#usage = { input_tokens: Number(u.prompt_tokens ?? 0), output_tokens: Number(u.completion_tokens ?? 0) };
    }
    for (const choice of (chunk.choices ?? []) as Obj[]) {
      const delta = (choice.delta ?? {}) as Obj;
      if (typeof delta.content === 'string' && delta.content !== '') {
        if (this.#open?.kind !== 'text') out.push(...this.#start({ type: 'text', text: '' }, 'text'));
        out.push({
          type: 'content_block_delta',
          index: this.#open!.index,
          delta: { type: 'text_delta', text: delta.content },
        });
      }
      for (const call of (delta.tool_calls ?? []) as Obj[]) {
        const k = Number(call.index ?? 0);
        const fn = (call.function ?? {}) as Obj;
        if (!this.#toolBlock.has(k)) {
          out.push(
            ...this.#start(
              { type: 'tool_use', id: String(call.id ?? syntheticId('call_')), name: String(fn.name ?? ''), input: {} },
              'tool',
              k,
            ),
          );
          this.#toolBlock.set(k, this.#open!.index);
        }
        if (typeof fn.arguments === 'string' && fn.arguments !== '') {
          out.push({
            type: 'content_block_delta',
            index: this.#toolBlock.get(k)!,
            delta: { type: 'input_json_delta', partial_json: fn.arguments },
          });
        }
      }
      if (typeof choice.finish_reason === 'string') this.#stop = own(FINISH_IN, choice.finish_reason) ?? 'end_turn';
    }
    return out;
  }

  #start(
    block: Extract<CEvent, { type: 'content_block_start' }>['content_block'],
    kind: 'text' | 'tool',
    call?: number,
  ): CEvent[] {
    const out: CEvent[] = [];
    if (this.#open) out.push({ type: 'content_block_stop', index: this.#open.index });
    this.#open = { index: this.#blocks++, kind, call };
    out.push({ type: 'content_block_start', index: this.#open.index, content_block: block });
    return out;
  }

  #finish(): CEvent[] {
    if (this.#done) return [];
    this.#done = true;
    const out: CEvent[] = [];
    if (!this.#started)
      out.push({
        type: 'message_start',
        message: { id: syntheticId('msg_'), model: '', usage: { input_tokens: 0, output_tokens: 0 } },
      });
    if (this.#open) out.push({ type: 'content_block_stop', index: this.#open.index });
    out.push({
      type: 'message_delta',
      delta: { stop_reason: this.#stop ?? 'end_turn' },
      usage: { output_tokens: this.#usage.output_tokens, input_tokens: this.#usage.input_tokens },
    });
    out.push({ type: 'message_stop' });
    return out;
  }

  end(): CEvent[] {
    return this.#finish();
  }
}

/** Canonical events → chat chunks for an openai-chat agent. */
export class ChatEmitter {
  #id = syntheticId('chatcmpl-');
  #model = '';
  #created = Math.floor(Date.now() / 1000);
  #toolIndex = new Map<number, number>();
  #usage = { input_tokens: 0, output_tokens: 0 };
  #finish: string | null = null;

  #chunk(delta: Obj, finish: string | null = null, extra: Obj = {}): string {
    return formatSse(null, {
      id: this.#id,
      object: 'chat.completion.chunk',
      created: this.#created,
      model: this.#model,
      choices: [{ index: 0, delta, finish_reason: finish, logprobs: null }],
      ...extra,
    });
  }

  emit(e: CEvent): string {
    switch (e.type) {
      case 'message_start':
        this.#model = e.message.model;
        this.#usage.input_tokens = e.message.usage.input_tokens;
        return this.#chunk({ role: 'assistant', content: '' });
      case 'content_block_start':
        if (e.content_block.type === 'tool_use') {
          const k = this.#toolIndex.size;
          this.#toolIndex.set(e.index, k);
          return this.#chunk({
            tool_calls: [
              {
                index: k,
                id: e.content_block.id,
                type: 'function',
                function: { name: e.content_block.name, arguments: '' },
              },
            ],
          });
        }
        return '';
      case 'content_block_delta':
        if (e.delta.type === 'text_delta') return this.#chunk({ content: e.delta.text });
        if (e.delta.type === 'input_json_delta')
          return this.#chunk({
            tool_calls: [{ index: this.#toolIndex.get(e.index) ?? 0, function: { arguments: e.delta.partial_json } }],
          });
        return '';
      case 'message_delta':
        if (e.usage.input_tokens) this.#usage.input_tokens = e.usage.input_tokens;
        this.#usage.output_tokens = e.usage.output_tokens;
        this.#finish = own(FINISH_OUT, e.delta.stop_reason ?? 'end_turn') ?? 'stop';
        return this.#chunk({}, this.#finish);
      case 'message_stop': {
        const usage = {
          prompt_tokens: this.#usage.input_tokens,
          completion_tokens: this.#usage.output_tokens,
          total_tokens: this.#usage.input_tokens + this.#usage.output_tokens,
        };
        return (
          formatSse(null, {
            id: this.#id,
            object: 'chat.completion.chunk',
            created: this.#created,
            model: this.#model,
            choices: [],
            usage,
          }) + formatSse(null, '[DONE]')
        );
      }
      default:
        return '';
    }
  }

  end(): string {
    return '';
  }
}

export type { CMessage };
