import { SseParser } from '../../../core/sse.ts';
import type { WireFormat } from '../../../pipeline/policy/snapshot.ts';
import * as anthropic from './anthropic.ts';
import { TranslationError } from '../errors.ts';
import type { CEvent, CRequest, CResponse } from './canonical.ts';
import * as chat from './openai-chat.ts';
import * as responses from './openai-responses.ts';

// Cross-format translation (spec rule 7, `--translate`): used only when the agent's wire format differs
// from `--translate-upstream-format`; same-format traffic never comes here and stays byte-transparent.

type Obj = Record<string, unknown>;

interface Codec {
  route: string;
  requestToCanonical(body: Obj): CRequest;
  requestFromCanonical(req: CRequest): Obj;
  responseToCanonical(body: Obj): CResponse;
  responseFromCanonical(res: CResponse): Obj;
  parser(): { parse(event: string | null, data: string): CEvent[]; end(): CEvent[] };
  emitter(): { emit(e: CEvent): string; end(): string };
}

const CODECS: Record<WireFormat, Codec> = {
  'anthropic-messages': {
    route: '/v1/messages',
    ...anthropic,
    parser: () => ({ parse: anthropic.parseEvent, end: () => [] }),
    emitter: () => new anthropic.AnthropicEmitter(),
  },
  'openai-chat': {
    route: '/v1/chat/completions',
    ...chat,
    parser: () => new chat.ChatParser(),
    emitter: () => new chat.ChatEmitter(),
  },
  'openai-responses': {
    route: '/v1/responses',
    ...responses,
    parser: () => new responses.ResponsesParser(),
    emitter: () => new responses.ResponsesEmitter(),
  },
};

export function routeOf(format: WireFormat): string {
  return CODECS[format].route;
}

function parseObject(body: Buffer, what: string): Obj {
  let value: unknown;
  try {
    value = JSON.parse(body.toString('utf8'));
  } catch {
    throw new TranslationError(`${what} is not valid JSON`);
  }
  if (value === null || typeof value !== 'object' || Array.isArray(value))
    throw new TranslationError(`${what} must be a JSON object`);
  return value as Obj;
}

export function translateRequest(from: WireFormat, to: WireFormat, body: Buffer): Buffer {
  const canonical = CODECS[from].requestToCanonical(parseObject(body, 'request body'));
  return Buffer.from(JSON.stringify(CODECS[to].requestFromCanonical(canonical)));
}

export function translateResponse(from: WireFormat, to: WireFormat, body: Buffer): Buffer {
  const canonical = CODECS[from].responseToCanonical(parseObject(body, 'upstream response'));
  return Buffer.from(JSON.stringify(CODECS[to].responseFromCanonical(canonical)));
}

/** Upstream SSE bytes in, agent SSE text out, event by event as they arrive. */
export class StreamTranslator {
  #sse = new SseParser();
  #parser;
  #emitter;

  constructor(from: WireFormat, to: WireFormat) {
    this.#parser = CODECS[from].parser();
    this.#emitter = CODECS[to].emitter();
  }

  push(chunk: Uint8Array): string {
    let out = '';
    for (const e of this.#sse.push(chunk)) out += this.#translate(e.event, e.data);
    return out;
  }

  end(): string {
    let out = '';
    for (const e of this.#sse.end()) out += this.#translate(e.event, e.data);
    for (const c of this.#parser.end()) out += this.#emitter.emit(c);
    return out + this.#emitter.end();
  }

  #translate(event: string | null, data: string): string {
    if (data === '') return '';
    let out = '';
    let events: CEvent[];
    try {
      events = this.#parser.parse(event, data);
    } catch {
      return ''; // an event we cannot read is dropped, not fatal to the stream
    }
    for (const c of events) out += this.#emitter.emit(c);
    return out;
  }
}
