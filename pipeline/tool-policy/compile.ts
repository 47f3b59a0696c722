import { isValidPattern } from '../path-match.ts';
import type { InspectionRule, LlmGovernance } from '../policy/governance.ts';
import { canonicalJson, sha256 } from './arguments.ts';
import { splitPath } from './arg-path.ts';

// The resolved `llm_policy.inspection` (pipeline/policy/governance.ts) compiled once into the rules
// the evaluator walks (evaluate.ts; docs/tool-policy.md). Compiled once per policy content: by the
// object's identity (a snapshot resolves its governance once), else by its canonical JSON.
//
//   inspection ─▶ no rule at all ─▶ null (no tool policy: the relays take their zero-cost path)
//              └▶ { version: sha256(canonical JSON)[0..16], rules: every inspector's, in order }

export type ToolVerdictName = 'allow' | 'require_approval' | 'deny';

/** Strictness: the strictest matching verdict wins. */
export const VERDICT_RANK: Readonly<Record<ToolVerdictName, number>> = { allow: 0, require_approval: 1, deny: 2 };

export interface CompiledToolRule {
  /** `<inspector>.rules[j]`: the record's name for it. */
  name: string;
  /** The inspector's name, or `inspectors[i]` when it has none. */
  inspector: string;
  /** The `tool` glob; null matches every tool. */
  tool: string | null;
  /** The `model_match` glob; null matches every model. */
  model: string | null;
  verdict: ToolVerdictName;
  /**
   * Set when the rule as written did not say a verdict the evaluator knows (none, or an unknown one): it
   * is then a deny (fail closed), and the reason says so.
   */
  verdictNote: string | null;
  summary: string | null;
  /** The `arg_gt` bounds, each path split once. */
  argGt: readonly { path: string; segments: readonly string[]; bound: number }[];
  /** A glob (tool or model_match) that is malformed: the rule matches every call (fail closed). */
  malformed: string | null;
}

export interface ToolPolicy {
  /** SHA-256 (hex, first 16) of the canonical JSON of the resolved inspection policy. */
  version: string;
  rules: readonly CompiledToolRule[];
}

export type InspectionPolicy = LlmGovernance['inspection'];

const byObject = new WeakMap<object, ToolPolicy | null>();
const byContent = new Map<string, ToolPolicy | null>();
/** Distinct policies kept by content: far past the number a proxy meets between two snapshots. */
const CONTENT_CACHE_SIZE = 256;

/** The tool policy of a resolved inspection policy; null when it has no rule at all. */
export function compileToolPolicy(inspection: InspectionPolicy | null | undefined): ToolPolicy | null {
  if (inspection === null || inspection === undefined || typeof inspection !== 'object') return null;
  const known = byObject.get(inspection);
  if (known !== undefined) return known;
  const text = canonicalJson(inspection);
  let policy = byContent.get(text);
  if (policy === undefined) {
    policy = compile(inspection, text);
    if (byContent.size >= CONTENT_CACHE_SIZE) byContent.clear();
    byContent.set(text, policy);
  }
  byObject.set(inspection, policy);
  return policy;
}

function compile(inspection: NonNullable<InspectionPolicy>, text: string): ToolPolicy | null {
  const rules: CompiledToolRule[] = [];
  const inspectors = Array.isArray(inspection.inspectors) ? inspection.inspectors : [];
  inspectors.forEach((inspector, i) => {
    const name = typeof inspector?.name === 'string' && inspector.name !== '' ? inspector.name : `inspectors[${i}]`;
    const list = Array.isArray(inspector?.rules) ? inspector.rules : [];
    list.forEach((rule, j) => {
      rules.push(compileRule(rule ?? {}, name, j));
    });
  });
  if (rules.length === 0) return null;
  return { version: sha256(text).slice(0, 16), rules };
}

function compileRule(rule: InspectionRule, inspector: string, j: number): CompiledToolRule {
  const str = (v: unknown) => (typeof v === 'string' ? v : null);
  const tool = str(rule.tool);
  const model = str(rule.model_match);
  let verdict: ToolVerdictName = 'deny';
  let verdictNote: string | null = null;
  if (rule.verdict === 'allow' || rule.verdict === 'deny' || rule.verdict === 'require_approval')
    verdict = rule.verdict;
  else if (rule.verdict === undefined || rule.verdict === null) verdictNote = 'it names no verdict (treated as deny)';
  else verdictNote = `its verdict ${JSON.stringify(String(rule.verdict))} is unknown (treated as deny)`;
  const argGt: { path: string; segments: string[]; bound: number }[] = [];
  let malformed: string | null = null;
  if (rule.arg_gt !== null && typeof rule.arg_gt === 'object') {
    for (const path of Object.keys(rule.arg_gt)) {
      const bound = (rule.arg_gt as Record<string, unknown>)[path];
      // Validation allows finite numbers only; anything else (a snapshot not validated) cannot be a bound:
      // the rule then matches whatever the arguments hold (fail closed).
      if (typeof bound !== 'number' || Number.isNaN(bound)) {
        malformed ??= `its bound for ${JSON.stringify(path)} is not a number`;
        continue;
      }
      argGt.push({ path, segments: splitPath(path), bound });
    }
  }
  if (tool !== null && !isValidPattern(tool)) malformed ??= `its tool glob ${JSON.stringify(tool)} is malformed`;
  if (model !== null && !isValidPattern(model))
    malformed ??= `its model_match glob ${JSON.stringify(model)} is malformed`;
  return {
    name: `${inspector}.rules[${j}]`,
    inspector,
    tool,
    model,
    verdict,
    verdictNote,
    summary: str(rule.summary),
    argGt,
    malformed,
  };
}
