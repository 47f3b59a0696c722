import t from 'tap';
import { chromium, type Browser } from 'playwright-core';
import { startBrokerHarness } from '../../fixtures/broker-harness.ts';
import { until } from '../../fixtures/eventually.ts';
import { approvalRequest, satelliteTokenOf } from './approvals-fixture.ts';
import { addAgent } from './secrets-fixture.ts';

// The approvals page in a real browser (Debian's chromium, headless, driven by playwright-core): an
// operator pastes a token; a pending call appears without a reload, with its arguments pretty-printed
// and a countdown; clicking approve decides it (the broker says approved, the page shows it). The page
// loads nothing but itself and the broker's API, under a strict CSP (a violation would be reported).

const CHROMIUM = '/usr/bin/chromium';
const h = await startBrokerHarness({ seedAdmin: ['admin-a'] }, [
  { clientId: 'admin-a', org: 'org-a', human: true },
  { clientId: 'member-a', org: 'org-a', human: true },
]);
t.teardown(() => h.close());
const token = await satelliteTokenOf(h);
await addAgent(h, 'agent-1', 'org-a', null);

let browser: Browser;
try {
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: [
      '--headless',
      '--no-sandbox',
      '--disable-gpu',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
    ],
  });
} catch (err) {
  if (process.env.CI) throw err;
  t.plan(0, `no chromium at ${CHROMIUM}: ${(err as Error).message.split('\n')[0]}`);
  process.exit(0);
}
t.teardown(() => browser.close());

t.test('the page: strict headers, no data without a token', async (t) => {
  const res = await h.operator(null, 'GET', '/approvals');
  t.equal(res.status, 200);
  t.match(res.type, /^text\/html/);
  const csp = String(res.headers['content-security-policy']);
  t.match(csp, /default-src 'none'/);
  t.match(csp, /script-src 'sha256-[A-Za-z0-9+/=]+'/);
  t.notMatch(csp, /unsafe-inline|unsafe-eval|https?:/, 'no inline allowance, no other origin');
  t.equal(res.headers['x-frame-options'], 'DENY');
  t.notMatch(res.body, /src=|href=/, 'nothing to load');
});

t.test('a pending call appears live; approve decides it', async (t) => {
  const context = await browser.newContext({ ignoreHTTPSErrors: true });
  t.teardown(() => context.close());
  const page = await context.newPage();
  const origin = `https://127.0.0.1:${h.broker.operatorPort}`;
  const elsewhere: string[] = [];
  const problems: string[] = [];
  page.on('request', (r) => {
    if (!r.url().startsWith(origin)) elsewhere.push(r.url());
  });
  page.on('console', (m) => {
    if (m.type() === 'error') problems.push(m.text());
  });
  page.on('pageerror', (e) => problems.push(e.message));
  await page.goto(`${origin}/approvals`);
  await page.fill('#token', await h.issuer!.token('admin-a'));
  await page.click('#save');
  // A locator, not waitForFunction: a string predicate is evaluated in the page, which its CSP
  // (no 'unsafe-eval') may refuse.
  await page.locator('#state', { hasText: /^live$/ }).waitFor({ timeout: 10_000 });

  // One made before the page listed, one after: both appear without a reload.
  const first = (
    await h.agent(
      'POST',
      '/v1/satellite/approvals',
      approvalRequest('org-a', 'agent-1', {
        tool: 'delete_repo',
        arguments: JSON.stringify({ repo: 'acme/prod', force: true }),
      }),
      token,
    )
  ).body;
  const card = page.locator(`[data-id="${first.id}"]`);
  await card.waitFor({ timeout: 10_000 });
  t.equal(await card.getAttribute('data-status'), 'pending');
  t.match(await card.locator('h2').textContent(), /delete_repo/);
  t.equal(
    await card.locator('pre.arguments').textContent(),
    JSON.stringify({ repo: 'acme/prod', force: true }, null, 2),
    'the arguments pretty-printed',
  );
  t.match(await card.textContent(), /transfers above 100 need a person/, 'the rule summary');
  t.match(await card.locator('.countdown').textContent(), /^expires in (1m 0s|\d+s)$/, 'a countdown');

  await card.locator('input.reason').fill('looked at it');
  await card.locator('button.approve').click();
  t.ok(
    await until(
      async () => (await h.operator('admin-a', 'GET', `/api/v1/approvals/${first.id}`)).body.status === 'approved',
    ),
    'the broker has it approved',
  );
  const decided = page.locator(`[data-id="${first.id}"][data-status="approved"]`);
  await decided.waitFor({ timeout: 10_000 });
  t.match(await decided.textContent(), /approved.*by admin-a — looked at it/);
  t.match((await h.operator('admin-a', 'GET', `/api/v1/approvals/${first.id}`)).body, {
    reason: 'looked at it',
    decided_by: 'admin-a',
  });

  // A decision made elsewhere reaches the page through the feed.
  // Markup in what a call carries is shown as text, never run or loaded.
  const markup = '<img src=/x onerror="document.title=1"><b>bold</b>';
  const second = (
    await h.agent(
      'POST',
      '/v1/satellite/approvals',
      approvalRequest('org-a', 'agent-1', { summary: markup, arguments: JSON.stringify({ html: markup }) }),
      token,
    )
  ).body;
  const held = page.locator(`[data-id="${second.id}"][data-status="pending"]`);
  await held.waitFor({ timeout: 10_000 });
  t.match(await held.textContent(), markup, 'the markup as text');
  t.equal(await held.locator('img, b').count(), 0, 'no element made from it');
  t.equal(await page.title(), 'dvx approvals');
  await h.operator('admin-a', 'POST', `/api/v1/approvals/${second.id}/deny`, { reason: 'no' });
  await page.locator(`[data-id="${second.id}"][data-status="denied"]`).waitFor({ timeout: 10_000 });

  t.same(elsewhere, [], 'no request to another origin');
  t.same(problems, [], 'no script error, no CSP violation');
});

t.test('a token without approvals:read is told so', async (t) => {
  const context = await browser.newContext({ ignoreHTTPSErrors: true });
  t.teardown(() => context.close());
  const page = await context.newPage();
  await page.goto(`https://127.0.0.1:${h.broker.operatorPort}/approvals`);
  await page.fill('#token', await h.issuer!.token('member-a'));
  await page.click('#save');
  await page.locator('#state', { hasText: /feed refused/ }).waitFor({ timeout: 10_000 });
  t.match(await page.textContent('#state'), /requires approvals:read/);
});

t.test('what the approver reads is what the tool gets: every invisible character is shown escaped', async (t) => {
  const context = await browser.newContext({ ignoreHTTPSErrors: true });
  t.teardown(() => context.close());
  const page = await context.newPage();
  await page.goto(`https://127.0.0.1:${h.broker.operatorPort}/approvals`);
  await page.fill('#token', await h.issuer!.token('admin-a'));
  await page.click('#save');
  // A locator, not waitForFunction: a string predicate is evaluated in the page, which its CSP
  // (no 'unsafe-eval') may refuse.
  await page.locator('#state', { hasText: /^live$/ }).waitFor({ timeout: 10_000 });
  // Tag characters (invisible "ASCII smuggling"), the Arabic letter mark (a bidi control), the Mongolian
  // vowel separator, an interlinear annotation, a variation selector and a Hangul filler.
  const hidden = ['\u{E0041}\u{E0042}', '\u061C', '\u180E', '\uFFF9', '\uFE0F', '\u3164'];
  const text = `rm -rf /tmp/x${hidden.join('')}`;
  const a = (
    await h.agent('POST', '/v1/satellite/approvals', approvalRequest('org-a', 'agent-1', { arguments: text }), token)
  ).body;
  const card = page.locator(`[data-id="${a.id}"]`);
  await card.waitFor({ timeout: 10_000 });
  const shown = (await card.locator('pre.arguments').textContent())!;
  t.notMatch(shown, /\p{C}|\u3164|\uFE0F/u, 'nothing invisible left in what the approver reads');
  for (const shownAs of ['\\u{e0041}', '\\u{e0042}', '\\u061c', '\\u180e', '\\ufff9', '\\ufe0f', '\\u3164'])
    t.ok(shown.includes(shownAs), `${shownAs} shown`);
  t.ok(shown.startsWith('rm -rf /tmp/x'), 'the visible text as it is');
  // JSON arguments keep their line breaks (pretty-printed); a line break inside raw text is kept too.
  const multi = (
    await h.agent(
      'POST',
      '/v1/satellite/approvals',
      approvalRequest('org-a', 'agent-1', { arguments: 'line one\nline\ttwo' }),
      token,
    )
  ).body;
  const card2 = page.locator(`[data-id="${multi.id}"]`);
  await card2.waitFor({ timeout: 10_000 });
  t.equal(await card2.locator('pre.arguments').textContent(), 'line one\nline\ttwo');
});
