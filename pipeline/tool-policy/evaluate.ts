import { pathMatch } from '../path-match.ts';
import { valuesAt } from './arg-path.ts';
import { parseArguments, type ParsedArguments } from './arguments.ts';
import { type CompiledToolRule, type ToolPolicy, type ToolVerdictName, VERDICT_RANK } from './compile.ts';

// One tool call against a compiled tool policy (compile.ts; docs/tool-policy.md, "Evaluation"). Pure:
// no I/O, no clock; the llmproxy's tool-call step and the streams' gate call it, and so can a gateway.
//
//   a rule matches when   its tool glob matches the call's name (no tool: every tool)
//                    and  its model_match glob matches the request's model (none: every model)
//                    and  each arg_gt path names a number greater than its bound
//                         (arguments that are not a JSON object meet every bound: fail closed)
//   the verdict          the strictest of the matching rules (deny > require_approval > allow),
//                        the first such rule named; no rule matches → allow

export interface ToolCallFacts {
  name: string;
  /** The arguments as JSON text, as the answer carries them. */
  arguments: string;
  /** The request's model; null or '' when unknown (then every model_match is met: fail closed). */
  model: string | null;
}

export interface ToolEvaluation {
  verdict: ToolVerdictName;
  /** `<inspector>.rules[j]` of the deciding rule; null when none matched. */
  rule: string | null;
  /** Its inspector's name (`inspectors[i]` when unnamed); null when none matched. */
  inspector: string | null;
  summary: string | null;
  /** A sentence fragment for people (and, `detailed`, the agent): which rule, and why it matched. */
  reason: string;
  /** The arguments parsed as a JSON object. */
  argsParsed: boolean;
  /** SHA-256 hex of the canonical JSON of the parsed arguments, or of the raw text (arguments.ts). */
  argsDigest: string;
}

export function evaluateToolCall(policy: ToolPolicy, call: ToolCallFacts): ToolEvaluation {
  const args = parseArguments(call.arguments);
  let best: CompiledToolRule | null = null;
  let bestWhy = '';
  for (const rule of policy.rules) {
    if (best !== null && VERDICT_RANK[rule.verdict] <= VERDICT_RANK[best.verdict]) continue;
    const why = matches(rule, call, args);
    if (why === null) continue;
    best = rule;
    bestWhy = why;
    if (rule.verdict === 'deny') break;
  }
  if (best === null) {
    return {
      verdict: 'allow',
      rule: null,
      inspector: null,
      summary: null,
      reason: `no rule of the tool policy matches the tool ${JSON.stringify(call.name)}`,
      argsParsed: args.object !== null,
      argsDigest: args.digest,
    };
  }
  return {
    verdict: best.verdict,
    rule: best.name,
    inspector: best.inspector,
    summary: best.summary,
    reason: sentence(best, bestWhy),
    argsParsed: args.object !== null,
    argsDigest: args.digest,
  };
}

const VERB: Record<ToolVerdictName, string> = {
  allow: 'allowed',
  require_approval: 'held for approval',
  deny: 'denied',
};

function sentence(rule: CompiledToolRule, why: string): string {
  const summary = rule.summary ? ` (${rule.summary})` : '';
  const note = rule.verdictNote ? `; ${rule.verdictNote}` : '';
  return `${VERB[rule.verdict]} by rule ${rule.name}${summary}${why ? `: ${why}` : ''}${note}`;
}

/** Why the rule matches this call ('' when nothing needs saying), or null when it does not. */
function matches(rule: CompiledToolRule, call: ToolCallFacts, args: ParsedArguments): string | null {
  if (rule.malformed !== null) return `${rule.malformed}, so it matches every call (fail closed)`;
  if (rule.tool !== null && !pathMatch(rule.tool, call.name)) return null;
  const why: string[] = [];
  if (rule.model !== null) {
    if (call.model === null || call.model === '') why.push('the request names no model, so model_match is met');
    else if (!pathMatch(rule.model, call.model)) return null;
  }
  if (rule.argGt.length === 0) return why.join('; ');
  if (args.object === null) {
    why.push(`the arguments ${args.problem}, so every arg_gt bound counts as met (fail closed)`);
    return why.join('; ');
  }
  for (const { path, segments, bound } of rule.argGt) {
    const over = valuesAt(args.object, segments).find((v) => {
      const n = numberOf(v);
      return n !== null && n > bound;
    });
    if (over === undefined) return null;
    why.push(`${path} is ${String(over)}, greater than ${bound}`);
  }
  return why.join('; ');
}

/** A decimal number written as text: `"100000"`, `" 1e6 "`, `"1_000_000"`, `"inf"`. */
const NUMERIC_TEXT = /^[+-]?(?:(?:\d(?:_?\d)*)?\.?\d(?:_?\d)*(?:[eE][+-]?\d+)?|inf(?:inity)?)$/i;

/**
 * The number a value stands for in an `arg_gt` comparison, or null: a JSON number, or text that reads
 * as one, since the tools' own argument parsers coerce it (pydantic's lax mode, zod's coerce, most
 * hand-written ones): `{"amount": "100000"}` pays 100000 (fail closed).
 */
function numberOf(v: unknown): number | null {
  if (typeof v === 'number') return v;
  if (typeof v !== 'string') return null;
  const text = v.trim();
  if (!NUMERIC_TEXT.test(text)) return null;
  if (/^[+-]?inf/i.test(text)) return text.startsWith('-') ? -Infinity : Infinity;
  return Number(text.replaceAll('_', ''));
}
