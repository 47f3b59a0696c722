import type { Queryable } from '../../../core/sql.ts';
import type { BrokerDeps } from '../deps.ts';
import { appendEvent } from './store.ts';
import { approvalView, type ApprovalRow } from './view.ts';

// Every change of an approval goes two ways: into the feed's log (broker_approval_events, in the
// change's own transaction: the SSE feed reads it, and Last-Event-ID resumes from it), and, once
// committed, onto the in-process bus ('approvals'), which wakes the open feeds and the long-polls.
// Brokers sharing one store do not share a bus: their feeds also poll the log (operator-routes.ts).

export interface LoggedChange {
  seq: number;
  row: ApprovalRow;
}

/** Logs the change of `row` in its transaction `tx`; announce it once committed. */
export async function logChange(deps: BrokerDeps, tx: Queryable, row: ApprovalRow): Promise<LoggedChange> {
  const at = deps.now();
  return { seq: await appendEvent(tx, approvalView(row, at), new Date(at)), row };
}

/** Tells this process's feeds and waiters about a committed change. */
export function announce(deps: BrokerDeps, change: LoggedChange): void {
  deps.bus.emit('approvals', { seq: change.seq, id: change.row.id, orgId: change.row.org_id });
}
