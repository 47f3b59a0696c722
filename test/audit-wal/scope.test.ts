import t from 'tap';
import { auditScopeOf } from '../../audit-wal/scope.ts';

// The audit read personas both planes apply (spec: Audit read personas): the capabilities held decide
// the predicate, `org` narrows only a platform operator, and no audit grant is no scope at all.

const human = { kind: 'human-operator', subject: 'alice', orgId: 'org-a' };
const held = (...c: string[]) => ({ capabilities: new Set(c) });
const filters = { org: 'org-b', action: 'grant.create' };

t.test('each persona gets its predicate; `org` is dropped unless platform', async (t) => {
  t.same(auditScopeOf(human, held('audit:read:all', 'audit:read'), filters), {
    predicate: { orgs: ['org-a'] },
    filters: { action: 'grant.create' },
    platform: false,
  });
  t.same(auditScopeOf(human, held('audit:read'), filters), {
    predicate: { orgs: ['org-a'], actor: 'alice' },
    filters: { action: 'grant.create' },
    platform: false,
  });
  t.same(auditScopeOf(human, { capabilities: new Set(), platform: true }, filters), {
    predicate: { orgs: 'all', kinds: ['event'] },
    filters,
    platform: true,
  });
  t.same(filters, { org: 'org-b', action: 'grant.create' }, 'the filters given are left as they were');
});

t.test('no audit grant, or no org, is no scope', async (t) => {
  t.equal(auditScopeOf(human, held('secrets:manage', 'members:*'), {}), null);
  t.equal(auditScopeOf({ ...human, orgId: '' }, held('audit:read:all'), {}), null, 'a token without an org');
});

t.test('an agent-operator reads what is attributed to its agent, with audit:read held by agent:<uid>', async (t) => {
  const agent = { kind: 'agent-operator', subject: 'agent:bot-1', orgId: 'org-a' };
  t.same(auditScopeOf(agent, held('audit:read', 'audit:read:all'), filters), {
    predicate: { orgs: ['org-a'], agent: 'bot-1' },
    filters: { action: 'grant.create' },
    platform: false,
  });
  t.equal(auditScopeOf(agent, held('audit:read:all'), {}), null, 'audit:read:all without audit:read does not');
  t.equal(auditScopeOf(agent, { capabilities: new Set(), platform: true }, {}), null, 'never platform');
});
