import { stringAt, topLevel, type Span } from '../../../pipeline/json-view.ts';
import { namedModels } from '../../../pipeline/named-models.ts';
import { gateRefusal, gatesOpen, PROVIDER_OF_FORMAT } from '../../../pipeline/policy/governance.ts';
import type { CallContext } from '../context.ts';
import { ERRORS, Refusal } from '../errors.ts';

// The governance llm_policy's access rules (docs/decisions.md, "The governance llm policy reaches the
// proxy"): `providers` and `models` allow/deny globs (every deny refuses, every allow list is a gate).
// They are access policy, not content inspection: enforced whether or not the org inspects
// (`inspect:llm`). A refusal is the spec's 403 content_policy_violation, recorded as the call's `deny`
// with its reason. No governance for the caller (ctx.governance null) or no glob: nothing is read.

/** After route: the provider the call reaches (its upstream's wire format: PROVIDER_OF_FORMAT). */
export function providerPolicy(ctx: CallContext): void {
  const providers = ctx.governance?.llm.providers;
  if (!providers || gatesOpen(providers)) return;
  const provider = PROVIDER_OF_FORMAT[ctx.upstreamFormat!];
  const why = gateRefusal(providers, provider);
  if (why !== null) throw new Refusal(ERRORS.contentPolicy, `llm_policy: provider ${provider} ${why}`);
}

/**
 * After prefix (the model is read): every model the call names. An inference call names its top-level
 * `model` (each duplicate in any letter case counts, as model_policy reads it); another body names what
 * pipeline/named-models.ts finds anywhere in it, and one it cannot read is refused.
 */
export function modelPolicy(ctx: CallContext): void {
  const models = ctx.governance?.llm.models;
  if (!models || gatesOpen(models) || ctx.body.length === 0) return;
  let named: (string | null)[] | null;
  if (ctx.inference) {
    const spans: Span[] = [];
    topLevel(ctx.body, 'model', spans);
    named = spans.map((s) => stringAt(ctx.body, s));
  } else {
    named = namedModels(ctx.body, ctx.req.headers['content-type'] ?? null);
  }
  if (named === null)
    throw new Refusal(
      ERRORS.contentPolicy,
      'llm_policy: the request may name a model in a form the proxy cannot read, and a models policy applies',
    );
  for (const model of new Set(named)) {
    const why = gateRefusal(models, model);
    if (why !== null)
      throw new Refusal(
        ERRORS.contentPolicy,
        `llm_policy: model ${model === null ? '(not a string)' : JSON.stringify(model.slice(0, 256))} ${why}`,
      );
  }
}
