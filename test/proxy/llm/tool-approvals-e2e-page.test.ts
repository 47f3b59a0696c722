import t from 'tap';
import { chromium, type Browser } from 'playwright-core';
import { until } from '../../fixtures/eventually.ts';
import {
  approvalView,
  decisionsOf,
  denial,
  pendingOf,
  startE2eBroker,
  startE2eProxy,
  viaSdk,
} from './tool-approvals-fixture.ts';

// The whole loop with a person at the approvals page: an agent's official SDK waits on a call llmproxy
// holds; the page (GET /approvals on the broker's operator listener, headless Debian chromium driven
// by playwright-core) shows it without a reload; clicking approve releases the held answer to the SDK,
// clicking deny with a reason gives the agent the denial.

const CHROMIUM = '/usr/bin/chromium';
const b = await startE2eBroker();
t.teardown(() => b.close());
const h = await startE2eProxy(b);
t.teardown(() => h.close());

let browser: Browser;
try {
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking'],
  });
} catch (err) {
  if (process.env.CI) throw err;
  t.plan(0, `no chromium at ${CHROMIUM}: ${(err as Error).message.split('\n')[0]}`);
  process.exit(0);
}
t.teardown(() => browser.close());

t.test('a person at the page approves, then denies, what SDK clients wait on through llmproxy', async (t) => {
  const context = await browser.newContext({ ignoreHTTPSErrors: true });
  t.teardown(() => context.close());
  const page = await context.newPage();
  const problems: string[] = [];
  page.on('pageerror', (e) => problems.push(e.message));
  await page.goto(`https://127.0.0.1:${b.broker.operatorPort}/approvals`);
  await page.fill('#token', await b.issuer!.token('admin-1'));
  await page.click('#save');
  // A locator, not waitForFunction: a string predicate is evaluated in the page, which its CSP
  // (no 'unsafe-eval') may refuse.
  await page.locator('#state', { hasText: /^live$/ }).waitFor({ timeout: 10_000 });

  // Approve: the Anthropic SDK's plain call gets the held tool_use, as the upstream sent it.
  const args = { to: 'acct-9', amount: 900 };
  const waiting = viaSdk(h, 'anthropic-messages', false, 'agent-1', [{ name: 'hold_page_pay', input: args }]);
  let released = false;
  void waiting.then(() => (released = true));
  const pending = await pendingOf(b, 'hold_page_pay');
  const card = page.locator(`[data-id="${pending.id}"][data-status="pending"]`);
  await card.waitFor({ timeout: 10_000 });
  t.match(await card.locator('h2').textContent(), /hold_page_pay/);
  t.equal(await card.locator('pre.arguments').textContent(), JSON.stringify(args, null, 2));
  t.match(await card.textContent(), /A person decides/, "the rule's summary");
  t.notOk(released, 'the SDK still waits');
  await card.locator('button.approve').click();
  const got = await waiting;
  t.same(got.seen, [{ call: 'hold_page_pay', id: 'toolu_1', args: JSON.stringify(args) }], 'released to the SDK');
  t.equal(got.stop, 'tool_use');
  await page.locator(`[data-id="${pending.id}"][data-status="approved"]`).waitFor({ timeout: 10_000 });
  t.match(await approvalView(b, pending.id), { status: 'approved', decided_by: 'admin-1' });
  t.match((await decisionsOf(h, 'hold_page_pay'))[0], {
    outcome: 'allow',
    decided_by: 'admin-1',
    approval_id: pending.id,
  });

  // Deny with a reason: the OpenAI SDK's streamed call reads the person's denial.
  const streamed = viaSdk(h, 'openai-chat', true, 'agent-1', [{ name: 'hold_page_rm', input: { path: '/' } }]);
  const second = await pendingOf(b, 'hold_page_rm');
  const card2 = page.locator(`[data-id="${second.id}"][data-status="pending"]`);
  await card2.waitFor({ timeout: 10_000 });
  await card2.locator('input.reason').fill('not on prod');
  await card2.locator('button.deny').click();
  const denied = await streamed;
  t.same(denied.seen, [{ text: denial('hold_page_rm', 'call_1', 'denied by an approver: not on prod') }]);
  t.ok(await until(async () => (await approvalView(b, second.id)).status === 'denied'), 'the broker has it denied');
  t.match((await decisionsOf(h, 'hold_page_rm'))[0], { outcome: 'deny', reason: 'denied by admin-1: not on prod' });
  t.same(problems, [], 'no script error');
});
