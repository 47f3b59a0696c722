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

// openai-responses (`/v1/responses`) ⇄ canonical.

type Obj = Record<string, unknown>;

function contentToBlocks(content: unknown): CBlock[] {
  if (typeof content === 'string') return content === '' ? [] : [{ type: 'text', text: content }];
  if (!Array.isArray(content)) return [];
  return (content as Obj[]).map((p): CBlock => {
    if (p.type === 'input_text' || p.type === 'output_text' || p.type === 'text')
      return { type: 'text', text: String(p.text ?? '') };
    if (p.type === 'input_image') {
      const url = String(p.image_url ?? '');
      const m = /^data:([^;]+);base64,(.*)$/s.exec(url);
      return m
        ? { type: 'image', source: { type: 'base64', media_type: m[1], data: m[2] } }
        : { type: 'image', source: { type: 'url', url } };
    }
    throw new TranslationError(`input content type "${String(p.type)}" cannot be translated`);
  });
}

const CHOICE_IN: Record<string, CToolChoice> = {
  auto: { type: 'auto' },
  none: { type: 'none' },
  required: { type: 'any' },
};

export function requestToCanonical(body: Obj): CRequest {
  const system: string[] = [];
  if (typeof body.instructions === 'string' && body.instructions) system.push(body.instructions);
  const messages: CMessage[] = [];
  const input = body.input;
  if (typeof input === 'string') messages.push({ role: 'user', content: [{ type: 'text', text: input }] });
  else if (Array.isArray(input)) {
    for (const item of input as Obj[]) {
      const type = item.type ?? 'message';
      if (type === 'message') {
        if (item.role === 'system' || item.role === 'developer') system.push(textOf(contentToBlocks(item.content)));
        else
          messages.push({
            role: item.role === 'assistant' ? 'assistant' : 'user',
            content: contentToBlocks(item.content),
          });
      } else if (type === 'function_call') {
        messages.push({
          role: 'assistant',
          content: [
            {
              type: 'tool_use',
              id: String(item.call_id),
              name: String(item.name),
              input: parseArguments(item.arguments),
            },
          ],
        });
      } else if (type === 'function_call_output') {
        messages.push({
          role: 'user',
          content: [
            {
              type: 'tool_result',
              tool_use_id: String(item.call_id),
              content: typeof item.output === 'string' ? item.output : JSON.stringify(item.output),
            },
          ],
        });
      } else if (type !== 'reasoning') {
        throw new TranslationError(`input item type "${String(type)}" cannot be translated`);
      }
    }
  } else throw new TranslationError('input must be a string or an array of items');
  const req: CRequest = {
    model: String(body.model ?? ''),
    messages: mergeRoles(messages),
    max_tokens: Number(body.max_output_tokens ?? DEFAULT_MAX_TOKENS),
  };
  if (system.length > 0) req.system = system.join('\n\n');
  if (typeof body.temperature === 'number') req.temperature = body.temperature;
  if (typeof body.top_p === 'number') req.top_p = body.top_p;
  if (body.stream === true) req.stream = true;
  if (Array.isArray(body.tools)) {
    req.tools = (body.tools as Obj[])
      .filter((t) => t.type === 'function')
      .map((t) => ({
        name: String(t.name),
        ...(t.description ? { description: String(t.description) } : {}),
        input_schema: t.parameters ?? { type: 'object', properties: {} },
      }));
  }
  const choice = body.tool_choice;
  if (typeof choice === 'string' && own(CHOICE_IN, choice)) req.tool_choice = own(CHOICE_IN, choice);
  else if (choice && typeof choice === 'object' && (choice as Obj).type === 'function')
    req.tool_choice = { type: 'tool', name: String((choice as Obj).name) };
  return req;
}

export function requestFromCanonical(req: CRequest): Obj {
  const input: Obj[] = [];
  for (const m of req.messages) {
    const parts: Obj[] = [];
    const flush = () => {
      if (parts.length) input.push({ type: 'message', role: m.role, content: parts.splice(0) });
    };
    for (const b of m.content) {
      if (b.type === 'text') parts.push({ type: m.role === 'assistant' ? 'output_text' : 'input_text', text: b.text });
      else if (b.type === 'image')
        parts.push({
          type: 'input_image',
          image_url: b.source.type === 'base64' ? `data:${b.source.media_type};base64,${b.source.data}` : b.source.url,
        });
      else if (b.type === 'tool_use') {
        flush();
        input.push({ type: 'function_call', call_id: b.id, name: b.name, arguments: JSON.stringify(b.input ?? {}) });
      } else if (b.type === 'tool_result') {
        flush();
        input.push({ type: 'function_call_output', call_id: b.tool_use_id, output: textOf(b.content) });
      }
    }
    flush();
  }
  const out: Obj = { model: req.model, input, max_output_tokens: req.max_tokens };
  if (req.system) out.instructions = req.system;
  if (req.temperature !== undefined) out.temperature = req.temperature;
  if (req.top_p !== undefined) out.top_p = req.top_p;
  if (req.stream) out.stream = true;
  if (req.tools)
    out.tools = req.tools.map((t) => ({
      type: 'function',
      name: t.name,
      ...(t.description ? { description: t.description } : {}),
      parameters: t.input_schema,
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
            : { type: 'function', name: c.name };
  }
  return out;
}

export function responseToCanonical(body: Obj): CResponse {
  const content: CBlock[] = [];
  for (const item of (body.output ?? []) as Obj[]) {
    if (item.type === 'message') content.push(...contentToBlocks(item.content));
    else if (item.type === 'function_call')
      content.push({
        type: 'tool_use',
        id: String(item.call_id),
        name: String(item.name),
        input: parseArguments(item.arguments),
      });
  }
  const usage = (body.usage ?? {}) as Obj;
  const incomplete = (body.incomplete_details as Obj | null | undefined)?.reason;
  const stop: CStopReason = content.some((b) => b.type === 'tool_use')
    ? 'tool_use'
    : incomplete === 'max_output_tokens'
      ? 'max_tokens'
      : 'end_turn';
  return {
    id: String(body.id ?? syntheticId('resp_')),
    model: String(body.model ?? ''),
    content,
    stop_reason: stop,
    usage: { input_tokens: Number(usage.input_tokens ?? 0), output_tokens: Number(usage.output_tokens ?? 0) },
  };
}

function outputItems(content: CBlock[], status: string): Obj[] {
  const out: Obj[] = [];
  const text = content
    .filter((b) => b.type === 'text')
    .map((b) => (b as { text: string }).text)
    .join('');
  if (text)
    out.push({
      type: 'message',
      id: syntheticId('msg_'),
      status,
      role: 'assistant',
      content: [{ type: 'output_text', text, annotations: [] }],
    });
  for (const b of content) {
    if (b.type === 'tool_use')
      out.push({
        type: 'function_call',
        id: syntheticId('fc_'),
        call_id: b.id,
        name: b.name,
        arguments: JSON.stringify(b.input ?? {}),
        status,
      });
  }
  return out;
}

function responseObject(
  id: string,
  model: string,
  output: Obj[],
  usage: CResponse['usage'] | null,
  status: string,
  stop: CStopReason | null,
): Obj {
  return {
    id: id.startsWith('resp_') ? id : `resp_${id}`,
    object: 'response',
    created_at: Math.floor(Date.now() / 1000),
    status,
    error: null,
    incomplete_details: stop === 'max_tokens' ? { reason: 'max_output_tokens' } : null,
    model,
    output,
    parallel_tool_calls: true,
    tool_choice: 'auto',
    tools: [],
    usage: usage
      ? {
          input_tokens: usage.input_tokens,
          output_tokens: usage.output_tokens,
          total_tokens: usage.input_tokens + usage.output_tokens,
        }
      : null,
  };
}

export function responseFromCanonical(res: CResponse): Obj {
  const status = res.stop_reason === 'max_tokens' ? 'incomplete' : 'completed';
  return responseObject(res.id, res.model, outputItems(res.content, 'completed'), res.usage, status, res.stop_reason);
}

/** Upstream responses-API events → canonical events. */
export class ResponsesParser {
  #started = false;
  #blocks = 0;
  #open: number | null = null;
  #itemBlock = new Map<string, number>();
  #sawTool = false;
  #done = false;

  parse(event: string | null, data: string): CEvent[] {
    const e = JSON.parse(data) as Obj;
    const type = String(e.type ?? event ?? '');
    const out: CEvent[] = [];
    if (!this.#started && (type === 'response.created' || type === 'response.in_progress')) {
      this.#started = true;
      const r = (e.response ?? {}) as Obj;
      out.push({
        type: 'message_start',
        message: {
          id: String(r.id ?? syntheticId('msg_')),
          model: String(r.model ?? ''),
          usage: { input_tokens: 0, output_tokens: 0 },
        },
      });
      return out;
    }
    if (type === 'response.output_item.added') {
      const item = (e.item ?? {}) as Obj;
      if (item.type === 'function_call') {
        this.#sawTool = true;
        out.push(...this.#start({ type: 'tool_use', id: String(item.call_id), name: String(item.name), input: {} }));
        this.#itemBlock.set(String(item.id ?? item.call_id), this.#open!);
      }
      return out;
    }
    if (type === 'response.output_text.delta') {
      const key = `text:${String(e.item_id)}`;
      if (!this.#itemBlock.has(key)) {
        out.push(...this.#start({ type: 'text', text: '' }));
        this.#itemBlock.set(key, this.#open!);
      }
      out.push({
        type: 'content_block_delta',
        index: this.#itemBlock.get(key)!,
        delta: { type: 'text_delta', text: String(e.delta ?? '') },
      });
      return out;
    }
    if (type === 'response.function_call_arguments.delta') {
      const index = this.#itemBlock.get(String(e.item_id));
      if (index !== undefined)
        out.push({
          type: 'content_block_delta',
          index,
          delta: { type: 'input_json_delta', partial_json: String(e.delta ?? '') },
        });
      return out;
    }
    if (type === 'response.completed' || type === 'response.incomplete' || type === 'response.failed') {
      const r = (e.response ?? {}) as Obj;
      const usage = (r.usage ?? {}) as Obj;
      const reason = (r.incomplete_details as Obj | null | undefined)?.reason;
      return this.#finish(
        this.#sawTool ? 'tool_use' : reason === 'max_output_tokens' ? 'max_tokens' : 'end_turn',
        Number(usage.input_tokens ?? 0),
        Number(usage.output_tokens ?? 0),
      );
    }
    return out;
  }

  #start(block: Extract<CEvent, { type: 'content_block_start' }>['content_block']): CEvent[] {
    const out: CEvent[] = [];
    if (this.#open !== null) out.push({ type: 'content_block_stop', index: this.#open });
    this.#open = this.#blocks++;
    out.push({ type: 'content_block_start', index: this.#open, content_block: block });
    return out;
  }

  #finish(stop: CStopReason, input: number, output: number): CEvent[] {
    if (this.#done) return [];
    this.#done = true;
    const out: CEvent[] = [];
    if (!this.#started)
      out.push({
        type: 'message_start',
        message: { id: syntheticId('msg_'), model: '', usage: { input_tokens: 0, output_tokens: 0 } },
      });
    if (this.#open !== null) out.push({ type: 'content_block_stop', index: this.#open });
    out.push(
      { type: 'message_delta', delta: { stop_reason: stop }, usage: { output_tokens: output, input_tokens: input } },
      { type: 'message_stop' },
    );
    return out;
  }

  end(): CEvent[] {
    return this.#finish(this.#sawTool ? 'tool_use' : 'end_turn', 0, 0);
  }
}

/** Canonical events → responses-API events for an openai-responses agent. */
export class ResponsesEmitter {
  #seq = 0;
  #id = syntheticId('resp_');
  #model = '';
  #usage = { input_tokens: 0, output_tokens: 0 };
  #blocks = new Map<
    number,
    { kind: 'text' | 'tool'; itemId: string; outputIndex: number; text: string; callId?: string; name?: string }
  >();
  #outputs = 0;
  #content: CBlock[] = [];
  #stop: CStopReason | null = null;

  #event(type: string, payload: Obj): string {
    return formatSse(type, { type, sequence_number: this.#seq++, ...payload });
  }

  emit(e: CEvent): string {
    switch (e.type) {
      case 'message_start': {
        this.#model = e.message.model;
        this.#usage.input_tokens = e.message.usage.input_tokens;
        const r = responseObject(this.#id, this.#model, [], null, 'in_progress', null);
        return this.#event('response.created', { response: r }) + this.#event('response.in_progress', { response: r });
      }
      case 'content_block_start': {
        const outputIndex = this.#outputs++;
        if (e.content_block.type === 'tool_use') {
          const itemId = syntheticId('fc_');
          this.#blocks.set(e.index, {
            kind: 'tool',
            itemId,
            outputIndex,
            text: '',
            callId: e.content_block.id,
            name: e.content_block.name,
          });
          return this.#event('response.output_item.added', {
            output_index: outputIndex,
            item: {
              type: 'function_call',
              id: itemId,
              call_id: e.content_block.id,
              name: e.content_block.name,
              arguments: '',
              status: 'in_progress',
            },
          });
        }
        if (e.content_block.type !== 'text') {
          this.#outputs--;
          return '';
        }
        const itemId = syntheticId('msg_');
        this.#blocks.set(e.index, { kind: 'text', itemId, outputIndex, text: '' });
        return (
          this.#event('response.output_item.added', {
            output_index: outputIndex,
            item: { type: 'message', id: itemId, status: 'in_progress', role: 'assistant', content: [] },
          }) +
          this.#event('response.content_part.added', {
            item_id: itemId,
            output_index: outputIndex,
            content_index: 0,
            part: { type: 'output_text', text: '', annotations: [] },
          })
        );
      }
      case 'content_block_delta': {
        const b = this.#blocks.get(e.index);
        if (!b) return '';
        if (e.delta.type === 'text_delta') {
          b.text += e.delta.text;
          return this.#event('response.output_text.delta', {
            item_id: b.itemId,
            output_index: b.outputIndex,
            content_index: 0,
            delta: e.delta.text,
          });
        }
        if (e.delta.type === 'input_json_delta') {
          b.text += e.delta.partial_json;
          return this.#event('response.function_call_arguments.delta', {
            item_id: b.itemId,
            output_index: b.outputIndex,
            delta: e.delta.partial_json,
          });
        }
        return '';
      }
      case 'content_block_stop': {
        const b = this.#blocks.get(e.index);
        if (!b) return '';
        if (b.kind === 'text') {
          this.#content.push({ type: 'text', text: b.text });
          const item = {
            type: 'message',
            id: b.itemId,
            status: 'completed',
            role: 'assistant',
            content: [{ type: 'output_text', text: b.text, annotations: [] }],
          };
          return (
            this.#event('response.output_text.done', {
              item_id: b.itemId,
              output_index: b.outputIndex,
              content_index: 0,
              text: b.text,
            }) +
            this.#event('response.content_part.done', {
              item_id: b.itemId,
              output_index: b.outputIndex,
              content_index: 0,
              part: { type: 'output_text', text: b.text, annotations: [] },
            }) +
            this.#event('response.output_item.done', { output_index: b.outputIndex, item })
          );
        }
        this.#content.push({ type: 'tool_use', id: b.callId!, name: b.name!, input: b.text ? safeParse(b.text) : {} });
        const item = {
          type: 'function_call',
          id: b.itemId,
          call_id: b.callId,
          name: b.name,
          arguments: b.text,
          status: 'completed',
        };
        return (
          this.#event('response.function_call_arguments.done', {
            item_id: b.itemId,
            output_index: b.outputIndex,
            arguments: b.text,
          }) + this.#event('response.output_item.done', { output_index: b.outputIndex, item })
        );
      }
      case 'message_delta':
        if (e.usage.input_tokens) this.#usage.input_tokens = e.usage.input_tokens;
        this.#usage.output_tokens = e.usage.output_tokens;
        this.#stop = e.delta.stop_reason;
        return '';
      case 'message_stop': {
        const status = this.#stop === 'max_tokens' ? 'incomplete' : 'completed';
        const r = responseObject(
          this.#id,
          this.#model,
          outputItems(this.#content, 'completed'),
          this.#usage,
          status,
          this.#stop,
        );
        return this.#event(status === 'completed' ? 'response.completed' : 'response.incomplete', { response: r });
      }
    }
  }

  end(): string {
    return '';
  }
}

function safeParse(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return {};
  }
}
