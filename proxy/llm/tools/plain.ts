import type { ServerResponse } from 'node:http';
import type { WireFormat } from '../../../pipeline/policy/snapshot.ts';
import { denialMessage } from './denial.ts';
import { anthropicPlain } from './plain-anthropic.ts';
import { openaiChatPlain } from './plain-openai-chat.ts';
import { openaiResponsesPlain } from './plain-openai-responses.ts';
import type { AnswerJson, Decide, PlainToolCodec, ToolCall, ToolVerdict } from './types.ts';

// A plain (held, whole) answer's tool calls decided before the agent sees any of it
// (docs/tool-policy.md; steps/relay-plain.ts calls this only when the call has a decider):
//
//   answer bytes ─parse─▶ calls ─▶ decide each, all at once ─▶ none refused: the ORIGINAL bytes
//                                                          └─▶ some refused: rewritten, re-serialized
//
// An answer is re-serialized only when a call was refused, so an untouched answer reaches the agent
// byte for byte (key order, number spelling, escapes, whitespace as the upstream wrote them). The
// agent may leave while a call waits (a person's approval): the wait then ends at once, and whoever
// owns the decider (the tool-call step) cancels what it holds.

export const PLAIN_CODECS: Readonly<Record<WireFormat, PlainToolCodec>> = {
  'anthropic-messages': anthropicPlain,
  'openai-chat': openaiChatPlain,
  'openai-responses': openaiResponsesPlain,
};

export type PlainDecision =
  /** No call refused (or none at all): send the answer as it came. */
  | { kind: 'untouched'; calls: number }
  /**
   * Some refused: send `body` instead. `refusedCalls`, with the answer's `id` (`answerId`, null when it
   * has none), is what a server-held conversation must be answered with (steps/refused-results.ts).
   */
  | {
      kind: 'rewritten';
      body: Buffer;
      calls: number;
      refused: number;
      answerId: string | null;
      refusedCalls: RefusedCall[];
    }
  /** The answer is not a JSON object: its calls cannot be found (the caller fails closed). */
  | { kind: 'unreadable'; why: string }
  /** The agent's connection closed before every call was decided. */
  | { kind: 'gone' };

/** A refused call and the denial the agent read in its place. */
export interface RefusedCall {
  call: ToolCall;
  message: string;
  /** A Responses `custom_tool_call` (its result is a `custom_tool_call_output`). */
  custom?: boolean;
}

export async function decidePlainAnswer(
  format: WireFormat,
  body: Buffer,
  decide: Decide,
  res: ServerResponse,
): Promise<PlainDecision> {
  let answer: unknown;
  try {
    answer = JSON.parse(body.toString('utf8'));
  } catch (err) {
    return { kind: 'unreadable', why: `the answer does not parse as JSON (${(err as Error).message})` };
  }
  if (answer === null || typeof answer !== 'object' || Array.isArray(answer)) {
    return { kind: 'unreadable', why: 'the answer is not a JSON object' };
  }
  const codec = PLAIN_CODECS[format];
  const calls = codec.calls(answer as AnswerJson);
  if (calls.length === 0) return { kind: 'untouched', calls: 0 };
  const verdicts = await untilClosed(res, Promise.all(calls.map((call) => decideSafely(decide, call))));
  if (verdicts === null) return { kind: 'gone' };
  const refused = new Map<number, string>();
  const refusedCalls: RefusedCall[] = [];
  verdicts.forEach((v, i) => {
    if (v.allow) return;
    refused.set(calls[i].seq, v.message);
    refusedCalls.push({
      call: calls[i],
      message: v.message,
      ...(isCustomCall(format, answer, calls[i]) ? { custom: true } : {}),
    });
  });
  if (refused.size === 0) return { kind: 'untouched', calls: calls.length };
  const rewritten = codec.rewrite(answer as AnswerJson, refused);
  return {
    kind: 'rewritten',
    body: Buffer.from(JSON.stringify(rewritten)),
    calls: calls.length,
    refused: refused.size,
    answerId: typeof (answer as AnswerJson).id === 'string' ? ((answer as AnswerJson).id as string) : null,
    refusedCalls,
  };
}

/** Whether a Responses call is a `custom_tool_call` item (its result has its own item type). */
function isCustomCall(format: WireFormat, answer: unknown, call: ToolCall): boolean {
  if (format !== 'openai-responses') return false;
  const output = (answer as AnswerJson).output;
  return (
    Array.isArray(output) &&
    output.some(
      (item: unknown) =>
        item !== null &&
        typeof item === 'object' &&
        (item as AnswerJson).type === 'custom_tool_call' &&
        (item as AnswerJson).call_id === call.id,
    )
  );
}

/** Decide never rejects by contract; should one anyway, the call is refused (fail closed), never run. */
async function decideSafely(decide: Decide, call: ToolCall): Promise<ToolVerdict> {
  try {
    const verdict = await decide(call);
    if (verdict && typeof verdict.allow === 'boolean') return verdict;
  } catch {
    // Fall through to the refusal: the decider failed, and a failed decision never runs a call.
  }
  return { allow: false, message: denialMessage(call, 'the tool-call decision failed', 'opaque') };
}

/** `work`'s value, or null as soon as the response closes first (the agent left). */
function untilClosed<T>(res: ServerResponse, work: Promise<T>): Promise<T | null> {
  if (res.destroyed) return Promise.resolve(null);
  return new Promise<T | null>((resolve, reject) => {
    const onClose = () => resolve(null);
    res.once('close', onClose);
    work.then(
      (value) => {
        res.off('close', onClose);
        resolve(value);
      },
      (err) => {
        res.off('close', onClose);
        reject(err);
      },
    );
  });
}
