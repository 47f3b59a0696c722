import type { BrokerDeps } from '../deps.ts';
import { startSweeper, type Sweeper } from './sweeper.ts';
import { ApprovalWaits } from './waits.ts';

// The approval loop's running parts, started with the broker and closed with it: the expiry sweeper and
// the satellites' long-polls. Its routes: operator-routes.ts (operator listener), satellite-routes.ts
// (agent listener, behind the satellite token). docs/approvals.md.

export interface ApprovalLoop {
  sweeper: Sweeper;
  waits: ApprovalWaits;
  close(): Promise<void>;
}

export function startApprovals(deps: BrokerDeps): ApprovalLoop {
  const sweeper = startSweeper(deps);
  const waits = new ApprovalWaits(deps);
  return {
    sweeper,
    waits,
    async close() {
      waits.close();
      await sweeper.close();
    },
  };
}
