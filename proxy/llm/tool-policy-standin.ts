import { createHash } from 'node:crypto';
import { pathMatch } from '../../pipeline/path-match.ts';
import { canonicalJson } from '../../pipeline/policy/config-values.ts';
import type { LlmGovernance } from '../../pipeline/policy/governance.ts';
import type { InspectionDisclosure } from './options.ts';
import type { ToolCall } from './tools/types.ts';

// STAND-IN, for the lead to swap: a minimal local version of what H3 builds in pipeline/tool-policy/
// (rule evaluation, digest, redaction) and proxy/llm/tools/denial.ts (the denial text), written to the
// semantics of the P10 common brief ("Evaluation semantics", "Denials the agent reads") so the
// decisions (tool-decisions.ts) can be built and tested before those land. tool-decisions.ts imports
// these five names from here and nothing else of the evaluator:
//
//   compileToolPolicy(inspection)            → ToolPolicy | null   (null: no rule at all)
//   evaluateToolCall(policy, {name, arguments, model}) → ToolEvaluation
//   redactArguments(argumentsText, secrets)  → string
//   denialMessage({name, id}, reason, disclosure) → string
//   type ToolVerdictName = 'allow' | 'deny' | 'require_approval'
//
// The names and signatures are those of H3's modules (branch p10-plain: pipeline/tool-policy/compile.ts
// compileToolPolicy and ToolPolicy, evaluate.ts evaluateToolCall and ToolEvaluation, redact.ts
// redactArguments; proxy/llm/tools/denial.ts denialMessage): the swap is this file deleted and
// tool-decisions.ts importing from those four paths.

export type ToolVerdictName = 'allow' | 'deny' | 'require_approval';

interface CompiledRule {
  /** `<inspector name or "inspectors[i]">.rules[j]` */
  name: string;
  inspector: string;
  tool: string | null;
  modelMatch: string | null;
  verdict: ToolVerdictName;
  summary: string | null;
  argGt: [path: string[], bound: number][];
}

export interface ToolPolicy {
  /** SHA-256 (hex, first 16) of the canonical JSON of the resolved inspection policy. */
  version: string;
  rules: readonly CompiledRule[];
}

export interface ToolEvaluation {
  verdict: ToolVerdictName;
  /** The deciding rule's name; null when no rule matched. */
  rule: string | null;
  inspector: string | null;
  summary: string | null;
  /** Why, for audit (and for the agent under --inspection-disclosure detailed). */
  reason: string;
  /** SHA-256 hex of the canonical JSON of the parsed arguments, else of the raw text. */
  argsDigest: string;
  /** The arguments parsed to a JSON object. */
  argsParsed: boolean;
}

const RANK: Record<ToolVerdictName, number> = { allow: 0, require_approval: 1, deny: 2 };

/** The policy's rules compiled once; null when there is no rule (no decision to make). */
export function compileToolPolicy(inspection: LlmGovernance['inspection'] | null | undefined): ToolPolicy | null {
  if (!inspection || !Array.isArray(inspection.inspectors)) return null;
  const rules: CompiledRule[] = [];
  inspection.inspectors.forEach((insp, i) => {
    const inspector = insp.name ?? `inspectors[${i}]`;
    (insp.rules ?? []).forEach((r, j) => {
      const verdict = (r.verdict ?? 'allow') as ToolVerdictName;
      rules.push({
        name: `${inspector}.rules[${j}]`,
        inspector,
        tool: r.tool ?? null,
        modelMatch: (r as { model_match?: string }).model_match ?? null,
        verdict: verdict in RANK ? verdict : 'deny',
        summary: r.summary ?? null,
        argGt: Object.entries(r.arg_gt ?? {}).map(([path, bound]) => [path.split('.'), bound]),
      });
    });
  });
  if (rules.length === 0) return null;
  const version = createHash('sha256').update(canonicalJson(inspection)).digest('hex').slice(0, 16);
  return { version, rules };
}

function parseArguments(text: string): { value: unknown; parsed: boolean; digest: string } {
  try {
    const value: unknown = JSON.parse(text);
    const digest = createHash('sha256').update(canonicalJson(value)).digest('hex');
    return { value, parsed: value !== null && typeof value === 'object' && !Array.isArray(value), digest };
  } catch {
    return { value: undefined, parsed: false, digest: createHash('sha256').update(text).digest('hex') };
  }
}

function at(value: unknown, path: string[]): unknown {
  let v = value;
  for (const key of path) {
    if (v === null || typeof v !== 'object' || !Object.hasOwn(v, key)) return undefined;
    v = (v as Record<string, unknown>)[key];
  }
  return v;
}

export function evaluateToolCall(
  policy: ToolPolicy,
  call: { name: string; arguments: string; model: string | null },
): ToolEvaluation {
  const args = parseArguments(call.arguments);
  let best: CompiledRule | null = null;
  let failClosed = false;
  for (const rule of policy.rules) {
    if (rule.tool !== null && !pathMatch(rule.tool, call.name)) continue;
    // A request that names no model meets every model_match (fail closed).
    if (rule.modelMatch !== null && call.model && !pathMatch(rule.modelMatch, call.model)) continue;
    let matched = true;
    if (rule.argGt.length > 0) {
      if (!args.parsed) failClosed = true;
      else
        matched = rule.argGt.every(([path, bound]) => {
          const v = at(args.value, path);
          return typeof v === 'number' && v > bound;
        });
    }
    if (!matched) continue;
    if (best === null || RANK[rule.verdict] > RANK[best.verdict]) best = rule;
  }
  const unparsed = failClosed ? ' (the arguments do not parse as a JSON object: every arg_gt condition matches)' : '';
  if (best === null)
    return {
      verdict: 'allow',
      rule: null,
      inspector: null,
      summary: null,
      reason: `no rule matched${unparsed}`,
      argsDigest: args.digest,
      argsParsed: args.parsed,
    };
  const what = best.verdict === 'allow' ? 'allowed' : best.verdict === 'deny' ? 'denied' : 'requires approval';
  return {
    verdict: best.verdict,
    rule: best.name,
    inspector: best.inspector,
    summary: best.summary,
    reason: `${best.summary ?? `${what} by rule ${best.name}`}${unparsed}`,
    argsDigest: args.digest,
    argsParsed: args.parsed,
  };
}

const REDACTED = '[REDACTED]';

/** The arguments text with every secret value of 8 or more characters (raw or JSON-escaped) replaced. */
export function redactArguments(text: string, secrets: readonly string[]): string {
  let out = text;
  for (const s of secrets) {
    if (s.length < 8) continue;
    out = out.split(s).join(REDACTED);
    const escaped = JSON.stringify(s).slice(1, -1);
    if (escaped !== s) out = out.split(escaped).join(REDACTED);
  }
  return out;
}

/** What the agent reads in place of a refused call (COMMON "Denials the agent reads"). */
export function denialMessage(
  call: Pick<ToolCall, 'name' | 'id'>,
  reason: string,
  disclosure: InspectionDisclosure,
): string {
  const why = disclosure === 'opaque' ? 'refused by policy' : reason.replace(/\.+$/, '');
  return `[dvx] The tool call ${call.name} (id ${call.id}) was not run: ${why}.`;
}
