import type { WireFormat } from '../../../pipeline/policy/snapshot.ts';

// The tool-call layer's shared contract (docs/decisions.md, "Tool calls decided before the agent acts").
// The wire-format code finds the tool calls in an answer and rewrites the refused ones; it never decides.
// The decision is one function, `Decide`, built per call by the tool-call step (tool-decisions.ts).

/** One tool call the model asked for, as the agent would receive it. */
export interface ToolCall {
  /** Its position among this answer's tool calls, from 0, in the order they appear. */
  seq: number;
  /** The call's id as the agent sees it: Anthropic `tool_use.id`, chat `tool_calls[].id`, Responses `call_id`. */
  id: string;
  name: string;
  /**
   * The arguments as JSON text, as the answer carries them: chat and Responses `arguments`, streams'
   * joined argument deltas, Anthropic's `input` serialized with JSON.stringify (plain) or its joined
   * `input_json_delta` (stream). May not parse: the evaluator fails closed on it.
   */
  arguments: string;
}

/** What happens to one call. */
export interface ToolVerdict {
  allow: boolean;
  /** When refused: the text the agent reads in place of the call (already shaped by --inspection-disclosure). */
  message: string;
}

/**
 * Decides one call. Called once per call, as soon as the call is whole (streams: at its last argument
 * delta), concurrently for parallel calls; may wait (a person's approval). Never rejects: a failure
 * inside is a refusal (fail closed).
 */
export type Decide = ((call: ToolCall) => Promise<ToolVerdict>) & {
  /**
   * A call refused without asking (the stream gate's own refusals: an inconsistent stream, the hold
   * bound), reported so that its owner records it like any decision. Never throws.
   */
  refused?: (call: ToolCall, reason: string) => void;
};

/** The formats' answers as parsed JSON (plain answers). */
export type AnswerJson = Record<string, unknown>;

/** A wire format's plain-answer side (tools/plain.ts). */
export interface PlainToolCodec {
  format: WireFormat;
  /** The tool calls of a successful answer, in order; [] when it has none. */
  calls(answer: AnswerJson): ToolCall[];
  /**
   * The answer with each refused call (key: seq) replaced by its denial in the format's own terms, and
   * the rest intact (text, allowed calls, usage, ids); the stop/finish reason says "tool use" only while
   * an allowed call remains.
   */
  rewrite(answer: AnswerJson, refused: ReadonlyMap<number, string>): AnswerJson;
}
