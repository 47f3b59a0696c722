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
  /** Some refused: send `body` instead. */
  | { kind: 'rewritten'; body: Buffer; calls: number; refused: number }
  /** The answer is not a JSON object: its calls cannot be found (the caller fails closed). */
  | { kind: 'unreadable'; why: string }
  /** The agent's connection closed before every call was decided. */
  | { kind: 'gone' };

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
  verdicts.forEach((v, i) => {
    if (!v.allow) refused.set(calls[i].seq, v.message);
  });
  if (refused.size === 0) return { kind: 'untouched', calls: calls.length };
  const rewritten = codec.rewrite(answer as AnswerJson, refused);
  return {
    kind: 'rewritten',
    body: Buffer.from(JSON.stringify(rewritten)),
    calls: calls.length,
    refused: refused.size,
  };
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
