import t from 'tap';
import { createLogger } from '../../../core/logger.ts';
import { validateOptions } from '../../../proxy/llm/options.ts';
import { OptionsError } from '../../../proxy/llm/errors.ts';
import { StoreSnapshotSource } from '../../../proxy/llm/store-source.ts';
import { startCpHarness } from '../../fixtures/controlplane-harness.ts';
import { PLATFORM_KEY, startHarness } from '../../fixtures/llmproxy-harness.ts';
import { freshPgDatabase } from '../../fixtures/pg-database.ts';

// llmproxy --database-dsn: the proxy reads the control plane's PostgreSQL store directly and follows
// its changes through LISTEN/NOTIFY, without a snapshot file and without a restart.
const pgDb = await freshPgDatabase('dvx_proxy_store');
if (!pgDb && process.env.CI) t.fail('PostgreSQL is not reachable on 127.0.0.1:5432');

if (pgDb) {
  t.teardown(() => pgDb.drop());
  const cph = await startCpHarness([{ clientId: 'root', org: 'org-a', human: true }], { seedAdmin: ['root'] });
  t.teardown(() => cph.close());
  const cp = await cph.start({ seedAdmin: ['root'], databaseDsn: pgDb.dsn });
  t.teardown(() => cp.close());
  const call = (method: string, path: string, body?: unknown) => cph.callAt(cp.port, 'root', method, path, body);
  await call('POST', '/orgs', { id: 'org-a', name: 'A' });
  await call('POST', '/enclaves', { name: 'eu', enclave_id: 'enc-1', owning_org: 'org-a' });
  await call('POST', '/orgs/org-a/agents', { uid: 'bot-1', name: 'b', enclave_id: 'enc-1' });

  const ask = async (h: Awaited<ReturnType<typeof startHarness>>, model: string) => {
    try {
      await h
        .anthropic(await h.token({ sub: 'bot-1', org_id: 'org-a', agent_name: 'b', group_id: null }))
        .messages.create({ model, max_tokens: 8, messages: [{ role: 'user', content: 'hi' }] });
      return 200;
    } catch (err) {
      return (err as { status?: number }).status ?? 0;
    }
  };
  const within = async (ms: number, check: () => Promise<boolean>) => {
    const start = Date.now();
    while (Date.now() - start < ms) {
      if (await check()) return Date.now() - start;
      await new Promise((r) => setTimeout(r, 50));
    }
    throw new Error(`not within ${ms} ms`);
  };

  for (const enclaveId of ['enc-1', '']) {
    t.test(
      `a write through the API is enforced at once (${enclaveId ? '--enclave-id enc-1' : 'every org and agent'})`,
      async (t) => {
        const h = await startHarness({
          secrets: { 'agent:bot-1': { 'agent:llmproxy.llm.api_key': PLATFORM_KEY } },
          proxy: { policySnapshot: '', databaseDsn: pgDb.dsn, enclaveId },
        });
        t.teardown(() => h.close());
        await call('DELETE', '/config/llmproxy/model_policy');
        await call('PUT', '/platform/config/llmproxy/downstream_url', { value: JSON.stringify(h.upstream.url) });
        await within(5000, async () => (await ask(h, 'claude-x')) === 200);
        await call('PUT', '/config/llmproxy/model_policy', {
          value: JSON.stringify({ mode: 'blocklist', models: ['claude-x'] }),
        });
        const ms = await within(5000, async () => (await ask(h, 'claude-x')) === 403);
        t.pass(`blocked ${ms} ms after the write`);
        t.equal(await ask(h, 'claude-y'), 200);
        await call('PUT', '/feature-flags/inspect:llm', { enabled: false });
        await within(5000, async () => (await ask(h, 'claude-x')) === 200);
        await call('PUT', '/feature-flags/inspect:llm', { enabled: true });
        await within(5000, async () => (await ask(h, 'claude-x')) === 403);
      },
    );
  }

  t.test('an unknown enclave is refused at start', async (t) => {
    const log = createLogger({ level: 'error', destination: { write: () => {} } });
    await t.rejects(
      StoreSnapshotSource.open({ dsn: pgDb.dsn, enclaveId: 'enc-nope', log, onChange: () => {} }),
      /no enclave enc-nope/,
    );
  });
}

t.test('options: PostgreSQL only, and not together with --policy-snapshot', async (t) => {
  const base = { tlsCert: 'c', tlsKey: 'k', agentJwks: 'j' };
  t.throws(() => validateOptions({ ...base, databaseDsn: 'pglite:///tmp/x' }), OptionsError);
  t.throws(() => validateOptions({ ...base, databaseDsn: 'postgres://x/y', policySnapshot: 'f.json' }), /choose one/);
  t.equal(validateOptions({ ...base, databaseDsn: 'postgres://x/y' }).databaseDsn, 'postgres://x/y');
});
