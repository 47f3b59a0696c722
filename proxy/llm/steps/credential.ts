import { resolveSnapshotSetting } from '../../../pipeline/policy/snapshot.ts';
import type { CallContext } from '../context.ts';
import { resolveCredential } from '../credentials.ts';
import { ERRORS, Refusal } from '../errors.ts';

// The upstream credential, by the caller's credential_mode (credentials.ts).

export function credential(ctx: CallContext): void {
  const { orgId, groupId, agentId } = ctx.identity!;
  const mode = resolveSnapshotSetting(ctx.snapshot, 'credential_mode', orgId, groupId, agentId) ?? 'platform';
  ctx.credential = resolveCredential(mode, ctx.identity!, ctx.req.headers, ctx.d.secrets);
  if (ctx.credential === null) {
    throw new Refusal(ERRORS.noCredential, `no LLM API credential configured (credential_mode ${mode})`);
  }
}
