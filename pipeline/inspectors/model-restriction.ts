import { stringAt, topLevel, type Span } from '../json-view.ts';
import { redact, type Finding } from '../finding.ts';
import { defineInspector } from '../inspector.ts';
import type { ModelPolicy } from '../policy/types.ts';
import { isValidPattern, pathMatch } from '../path-match.ts';
import { namedModels, type NamedModels } from '../named-models.ts';

// model_restriction: request phase only; reads the body's top-level `model` (spec: model_policy).
// Each layer (the base winner, then every pack) must permit the model: layers compose by AND.

export const id = 'model_restriction';

export interface ModelLayer {
  mode: ModelPolicy['mode'];
  /** Valid globs only: a malformed pattern matches nothing, so it is dropped at compile time. */
  globs: string[];
}

export interface ModelPlan {
  layers: ModelLayer[];
  /** Malformed globs, for the caller to log once per policy version. */
  malformed: string[];
}

export function compile(policies: readonly ModelPolicy[]): ModelPlan | null {
  if (policies.length === 0) return null;
  const malformed: string[] = [];
  const layers = policies.map((p) => ({
    mode: p.mode,
    globs: p.models.filter((g) => {
      const ok = isValidPattern(g);
      if (!ok) malformed.push(g);
      return ok;
    }),
  }));
  return { layers, malformed };
}

// Every request names a model, nearly always one of a few: each plan remembers what its globs said of
// the names it has seen (a glob match splits both strings into code points, a microsecond a call),
// a bounded number of names of a bounded length (a name is the caller's to choose).
const MEMO_NAMES = 256;
const MEMO_NAME_LENGTH = 256;
const memo = new WeakMap<ModelPlan, Map<string, boolean>>();

export function permitted(plan: ModelPlan, model: string | null): boolean {
  if (model === null || model.length > MEMO_NAME_LENGTH) return permittedNow(plan, model);
  let known = memo.get(plan);
  if (known === undefined) memo.set(plan, (known = new Map()));
  let ok = known.get(model);
  if (ok === undefined) {
    ok = permittedNow(plan, model);
    if (known.size >= MEMO_NAMES) known.clear();
    known.set(ownString(model), ok);
  }
  return ok;
}

/**
 * A copy of `s` in memory of its own. A name may be a slice of a much larger string (a multipart
 * part's text, trimmed: named-models.ts), and a slice keeps all of it alive; kept in the memo, 256 of
 * them held whole upload bodies (the attacker's review of "A small scan's fixed cost"). UTF-16 code
 * units, not UTF-8: a lone surrogate stays itself, so two names never share an entry.
 */
function ownString(s: string): string {
  return Buffer.from(s, 'utf16le').toString('utf16le');
}

function permittedNow(plan: ModelPlan, model: string | null): boolean {
  for (const layer of plan.layers) {
    const listed = model !== null && layer.globs.some((g) => pathMatch(g, model));
    if (layer.mode === 'allowlist' ? !listed : listed) return false;
  }
  return true;
}

/**
 * The top-level `model`, and every duplicate of it in any letter case: JSON.parse and Python read the
 * last `model`, but Go decoders (Ollama's OpenAI API, for one) take `Model` for the same field. Each
 * must be permitted.
 */
export function scan(body: Buffer, plan: ModelPlan): Finding[] {
  const spans: Span[] = [];
  topLevel(body, 'model', spans);
  if (spans.length === 0) return verdict(null, plan);
  for (const span of spans) {
    const found = verdict(stringAt(body, span), plan);
    if (found.length > 0) return found;
  }
  return [];
}

/**
 * The same check over every model a call names (a pass-through call; named-models.ts). Each must be
 * permitted; naming none is nothing to check. `null`, a body that may name a model in a form we cannot
 * read, is refused: the policy could not be applied to it.
 */
export function check(models: NamedModels, plan: ModelPlan): Finding[] {
  if (models === null) {
    return [
      {
        inspector_type: id,
        severity: 'block',
        description: 'request may name a model in a form the proxy cannot read, and a model_policy applies',
        match: '',
        location: 'model',
      },
    ];
  }
  for (const model of new Set(models)) {
    const found = verdict(model, plan);
    if (found.length > 0) return found;
  }
  return [];
}

function verdict(model: string | null, plan: ModelPlan): Finding[] {
  if (permitted(plan, model)) return [];
  const denying = plan.layers.find((l) => {
    const listed = model !== null && l.globs.some((g) => pathMatch(g, model));
    return l.mode === 'allowlist' ? !listed : listed;
  });
  const description =
    model === null
      ? 'request has no string model field and a model allowlist applies'
      : denying?.mode === 'blocklist'
        ? 'model matches a blocklist entry of model_policy'
        : 'model is not on the allowlist of model_policy';
  return [{ inspector_type: id, severity: 'block', description, match: redact(model ?? ''), location: 'model' }];
}

/**
 * The contract's face: the raw body only (a model name is read as JSON, which decodes its escapes),
 * never the normalized view (a model id is matched exactly as the upstream will read it).
 */
export const inspector = defineInspector<ModelPlan>({
  id,
  phases: ['request'],
  compile: (policy) => compile(policy.models),
  warnings: (plan) =>
    plan.malformed.map((glob) => ({ message: 'malformed model glob matches nothing', fields: { glob } })),
  scan(input, plan) {
    const anywhere = input.modelsAnywhere;
    return anywhere ? check(namedModels(input.raw, anywhere.contentType), plan) : scan(input.raw, plan);
  },
});
