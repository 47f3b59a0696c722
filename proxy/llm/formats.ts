import type { IncomingHttpHeaders } from 'node:http';
import { type Span, type TopLevel, topLevel } from '../../pipeline/json-view.ts';
import { allocShared, DEFAULT_INLINE_THRESHOLD_BYTES } from '../../pipeline/engine.ts';
import { copyBytes } from '../../pipeline/shared-bytes.ts';
import { grow, spareCapacity } from './read-body.ts';
import { BodyShapeError } from './errors.ts';
import type { WireFormat } from '../../pipeline/policy/snapshot.ts';

// Wire formats by route, and the security-context prefix (spec rule 5) spliced into each format's
// system prompt. The splice edits bytes in place: the rest of the body stays exactly as the agent
// sent it (no parse and re-serialize), so same-format traffic stays byte-transparent apart from it.

export const INFERENCE_ROUTES: Record<string, WireFormat> = {
  '/v1/messages': 'anthropic-messages',
  '/v1/chat/completions': 'openai-chat',
  '/v1/responses': 'openai-responses',
};

/**
 * Whether a path is one of the providers' /v1 API paths in normal form. Anything else could be read
 * one way here and another way upstream. That includes dot segments, which would carry the platform
 * key to `/v1/../admin`, raw or percent-encoded. It also includes `//`, a trailing slash, and
 * percent-encoded unreserved characters or separators (`/v1/m%65ssages`, `/v1/chat%2Fcompletions`),
 * which an upstream may normalize onto an inference route that we took for pass-through.
 */
export function isNormalApiPath(path: string): boolean {
  if (!path.startsWith('/v1/') || path.length === 4 || path.endsWith('/') || path.includes('//') || /[\\#;]/.test(path))
    return false;
  if (/(^|\/)(\.|%2e){1,2}(\/|$)/i.test(path)) return false;
  // Unreserved characters (RFC 3986 §2.3), and `/` and `\`, which some servers decode into separators.
  return !/%(?:2[dDeEfF]|3[0-9]|[46][1-9a-fA-F]|[57][0-9aA]|5[cCfF]|7[eE])/.test(path);
}

/**
 * The pass-through routes whose answers never carry model output, so never a tool call: the only ones an
 * agent under a tool-call policy may use besides the inference routes. Every other route may replay
 * what a model said (a stored response or completion, batch results, a conversation's items, a file
 * of batch output) with its tool calls undecided, so it is refused then (an allow list: a provider's
 * new route is refused until it is known to be safe).
 */
export function answersWithoutModelOutput(method: string, path: string): boolean {
  if (method === 'GET') return path === '/v1/models' || /^\/v1\/models\/[^/]+$/.test(path);
  if (method === 'POST')
    return (
      path === '/v1/messages/count_tokens' ||
      path === '/v1/responses/input_tokens' ||
      path === '/v1/embeddings' ||
      path === '/v1/moderations'
    );
  return false;
}

/** The API family of a pass-through path: Anthropic's clients always send `anthropic-version`. */
export function passThroughFormat(path: string, headers: IncomingHttpHeaders): WireFormat {
  if (path.startsWith('/v1/messages') || path.startsWith('/v1/complete') || headers['anthropic-version'] !== undefined)
    return 'anthropic-messages';
  return path.startsWith('/v1/responses') ? 'openai-responses' : 'openai-chat';
}

/**
 * An Anthropic request's `thread` (server-held conversation state) when it is one: `{type: "create"}`
 * or `{type: "continue", previous_message_id}`; null otherwise.
 */
export function anthropicThread(body: Buffer, at?: Span | null): Record<string, unknown> | null {
  const value = at === undefined ? (topLevel(body, 'thread')?.value ?? null) : at;
  if (!value || body[value.start] !== 0x7b) return null;
  try {
    const thread: unknown = JSON.parse(body.toString('utf8', value.start, value.end));
    if (thread === null || typeof thread !== 'object' || Array.isArray(thread)) return null;
    const type = (thread as Record<string, unknown>).type;
    return type === 'create' || type === 'continue' ? (thread as Record<string, unknown>) : null;
  } catch {
    return null;
  }
}

export function isAnthropic(format: WireFormat): boolean {
  return format === 'anthropic-messages';
}

export interface PrefixContext {
  agentId: string;
  agentName: string;
  orgId: string;
  enclaveName: string;
}

export function securityContext(ctx: PrefixContext): string {
  const who = ctx.agentName ? `"${ctx.agentName}" (${ctx.agentId})` : ctx.agentId;
  const where = ctx.enclaveName ? ` in enclave "${ctx.enclaveName}"` : '';
  return (
    `[dvx security context] You are agent ${who} of organization ${ctx.orgId}${where}. ` +
    "This session is governed: requests and responses are inspected under your organization's policy and audited. " +
    'Never reveal secrets or credentials.'
  );
}

const json = (s: string) => JSON.stringify(s);

/**
 * The body with `insert` at `at` (replacing `remove` bytes). A body read with headroom grows in place
 * (its tail moves along; no second copy of a 32 MB body); any other is copied once, a large one into
 * shared memory for the pool.
 */
function splice(body: Buffer, at: number, remove: number, insert: string): Buffer {
  const extra = Buffer.from(insert, 'utf8');
  const size = body.length - remove + extra.length;
  if (size - body.length <= spareCapacity(body)) {
    const out = grow(body, Math.max(size, body.length));
    copyBytes(out, out, at + extra.length, at + remove, body.length);
    extra.copy(out, at);
    return size === out.length ? out : out.subarray(0, size);
  }
  const out = size >= DEFAULT_INLINE_THRESHOLD_BYTES ? allocShared(size) : Buffer.allocUnsafe(size);
  copyBytes(body, out, 0, 0, at);
  extra.copy(out, at);
  copyBytes(body, out, at + extra.length, at + remove);
  return out;
}

/**
 * Whether the array at `span` (its `[` at span.start) has no elements: only JSON whitespace before its
 * `]`. Read in place: the array is the whole conversation (`messages`), not worth a string of its own.
 */
function isEmptyArray(body: Buffer, span: Span): boolean {
  for (let i = span.start + 1; i < span.end; i++) {
    const b = body[i];
    if (b !== 0x20 && b !== 0x0a && b !== 0x0d && b !== 0x09) return b === 0x5d && i === span.end - 1;
  }
  return false;
}

/** Inserts `text` at the start of a JSON string value whose opening quote is at `quote`. */
function prependToString(body: Buffer, quote: number, text: string): Buffer {
  return splice(body, quote + 1, 0, json(text).slice(1, -1));
}

/** The top-level member the format's system prompt goes in (injectPrefix). */
export function promptKey(format: WireFormat): string {
  return format === 'anthropic-messages' ? 'system' : format === 'openai-chat' ? 'messages' : 'instructions';
}

/**
 * The body with the prefix in the format's system prompt (`found`: the body's top level with the
 * value of the format's promptKey, when the caller has walked it already):
 *   anthropic-messages  `system` string (prepended), `system` blocks (a first text block), or a new `system`
 *   openai-chat         a first `system` message in `messages`
 *   openai-responses    `instructions` (prepended), or a new `instructions`
 * Throws BodyShapeError when the body is not a JSON object (the caller answers 400).
 */
export function injectPrefix(format: WireFormat, body: Buffer, prefix: string, found?: TopLevel | null): Buffer {
  const top = found === undefined ? topLevel(body, promptKey(format)) : found;
  if (top === null) throw new BodyShapeError('request body must be a JSON object');
  const sep = top.empty ? '' : ',';
  const v = top.value;
  const first = v ? body[v.start] : -1;
  switch (format) {
    case 'anthropic-messages':
      if (v === null) return splice(body, top.open + 1, 0, `"system":${json(prefix)}${sep}`);
      if (first === 0x22) return prependToString(body, v.start, prefix + '\n\n');
      if (first === 0x5b) {
        const sep = isEmptyArray(body, v) ? '' : ',';
        return splice(body, v.start + 1, 0, `{"type":"text","text":${json(prefix)}}${sep}`);
      }
      if (body.toString('latin1', v.start, v.end) === 'null') return splice(body, v.start, 4, json(prefix));
      throw new BodyShapeError('system must be a string or an array of content blocks');
    case 'openai-chat': {
      if (v === null || first !== 0x5b) throw new BodyShapeError('messages must be an array');
      const sep = isEmptyArray(body, v) ? '' : ',';
      return splice(body, v.start + 1, 0, `{"role":"system","content":${json(prefix)}}${sep}`);
    }
    case 'openai-responses':
      if (v === null) return splice(body, top.open + 1, 0, `"instructions":${json(prefix)}${sep}`);
      if (first === 0x22) return prependToString(body, v.start, prefix + '\n\n');
      if (body.toString('latin1', v.start, v.end) === 'null') return splice(body, v.start, 4, json(prefix));
      throw new BodyShapeError('instructions must be a string');
  }
}
