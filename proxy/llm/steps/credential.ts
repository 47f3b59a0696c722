import { resolveSnapshotSetting } from '../../../pipeline/policy/snapshot.ts';
import { governedSetting } from '../../../pipeline/policy/snapshot-governance.ts';
import type { CallContext } from '../context.ts';
import { resolveCredential } from '../credentials.ts';
import { ERRORS, Refusal } from '../errors.ts';

// The upstream credential, by the caller's credential_mode (credentials.ts): the setting, with the
// governance llm_policy's credential_mode where one is authored (snapshot-governance.ts).

export function credential(ctx: CallContext): void {
  const { orgId, groupId, agentId } = ctx.identity!;
  const mode =
    (ctx.governance === null
      ? resolveSnapshotSetting(ctx.snapshot, 'credential_mode', orgId, groupId, agentId)
      : governedSetting(ctx.snapshot, 'credential_mode', orgId, groupId, agentId)) ?? 'platform';
  ctx.credential = resolveCredential(mode, ctx.identity!, ctx.req.headers, ctx.d.secrets);
  if (ctx.credential === null) {
    throw new Refusal(ERRORS.noCredential, `no LLM API credential configured (credential_mode ${mode})`);
  }
}
