import t from 'tap';
import { agentStanding, RemovedAgents } from '../../../proxy/llm/agent-standing.ts';
import type { AgentIdentity } from '../../../proxy/llm/auth.ts';
import { validateSnapshot } from '../../../pipeline/policy/snapshot.ts';

// An agent a reload removed (listed by the snapshot before, not by the one loaded) is refused while an
// agent never listed stands as its credential says; listed again, the snapshot speaks for it. The
// memory of removals is bounded, the oldest forgotten first.

function snapshot(ids: string[]) {
  const agents: Record<string, unknown> = {};
  for (const id of ids)
    agents[id] = { org_id: 'org-1', group_id: null, name: id, status: 'active', contained: false, config: {} };
  return validateSnapshot({
    version: `v-${ids.join('-')}`,
    enclave: { id: 'enc-1', name: 'e', isolation_class: 'vm' },
    platform: {},
    orgs: { 'org-1': { config: {}, flags: {}, groups: {}, packs: [] } },
    agents,
  });
}

const who = (agentId: string): AgentIdentity => ({
  agentId,
  orgId: 'org-1',
  agentName: '',
  groupId: null,
  via: 'jwt',
  tokenHeader: 'authorization',
});

t.test('removed, never listed, listed again', async (t) => {
  const first = snapshot(['a', 'b']);
  const removed = new RemovedAgents(first);
  const second = snapshot(['b']);
  t.same(removed.observe(second), ['a'], 'the reload removed a');
  t.same(removed.observe(second), [], 'the same snapshot again: nothing more');
  t.match(agentStanding(second, who('a'), removed), {
    refused: true,
    why: 'removed',
    reason: 'agent was removed from the policy snapshot',
  });
  t.match(agentStanding(second, who('a')), { refused: false }, 'without the memory, it stands (llmproxy today)');
  t.match(agentStanding(second, who('new')), { refused: false }, 'an agent never listed stands');
  t.match(agentStanding(second, who('b'), removed), { refused: false });
  const third = snapshot(['a', 'b']);
  removed.observe(third);
  t.notOk(removed.has('a'), 'listed again: forgotten');
  t.match(agentStanding(third, who('a'), removed), { refused: false });
});

t.test('the memory is bounded: the oldest removal is forgotten first', async (t) => {
  const ids = Array.from({ length: 5 }, (_, i) => `agent-${i}`);
  const removed = new RemovedAgents(snapshot(ids), 3);
  // Removed one at a time, oldest first.
  for (let i = 1; i <= ids.length; i++) removed.observe(snapshot(ids.slice(i)));
  t.equal(removed.size, 3);
  t.same(
    ids.map((id) => removed.has(id)),
    [false, false, true, true, true],
  );
});
