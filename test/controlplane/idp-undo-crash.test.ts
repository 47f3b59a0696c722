import t from 'tap';
import { spawn, type ChildProcess } from 'node:child_process';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { startCpHarness } from '../fixtures/controlplane-harness.ts';
import { freshPgDatabase } from '../fixtures/pg-database.ts';
import { AUDIENCE } from '../fixtures/oidc-issuer.ts';
import type { AuditSink } from '../../audit-wal/sink.ts';
import { parseServiceAccountKey, tokenRequestForm } from '../../controlplane/idp/service-account-key.ts';

// The undo of an IdP registration is on record before the IdP is called, so a control
// plane killed (SIGKILL, a real child process) between the registration and the commit of the account
// leaves a row the next process acts on: the orphan client is removed at the real oidc-provider IdP. A
// row whose account did commit removes nothing. A kill during the registration itself (the IdP made
// the client, its answer never arrived) leaves a row without a client id: reported and audited.

const CHILD = fileURLToPath(new URL('../fixtures/controlplane-child.ts', import.meta.url));

const pgDb = await freshPgDatabase('dvx_idp_crash');
if (!pgDb) {
  if (process.env.CI) t.fail('no PostgreSQL at 127.0.0.1:5432');
  else t.plan(0, 'PostgreSQL not reachable');
} else {
  t.teardown(() => pgDb.drop());
  const h = await startCpHarness([{ clientId: 'root', org: 'org-a' }], { seedAdmin: ['root'] });
  t.teardown(() => h.close());
  const db = new pg.Client({ connectionString: pgDb.dsn });
  await db.connect();
  t.teardown(() => db.end());
  const children = new Set<ChildProcess>();
  t.teardown(() => {
    for (const c of children) c.kill('SIGKILL');
  });

  /** A control plane on PostgreSQL in a child process; `lines` are its stdout JSON lines (log and audit). */
  const startChild = async () => {
    const options = {
      addr: '127.0.0.1:0',
      tlsCert: join(h.dir, 'cert.pem'),
      tlsKey: join(h.dir, 'key.pem'),
      oidcIssuer: h.issuer.issuer,
      oidcAudience: AUDIENCE,
      idpKey: join(h.dir, 'idp-key.json'),
      databaseDsn: pgDb.dsn,
      seedAdmin: ['root'],
      idpUndoGraceMs: 400,
    };
    const child = spawn(process.execPath, [CHILD, JSON.stringify(options)], { stdio: ['ignore', 'pipe', 'inherit'] });
    children.add(child);
    const lines: Record<string, unknown>[] = [];
    let rest = '';
    const exited = new Promise<void>((r) => child.on('exit', () => r()));
    const port = await new Promise<number>((resolve, reject) => {
      child.stdout!.on('data', (d: Buffer) => {
        rest += d.toString();
        const parts = rest.split('\n');
        rest = parts.pop()!;
        for (const l of parts) {
          try {
            const line = JSON.parse(l) as Record<string, unknown>;
            lines.push(line);
            if (typeof line.child_port === 'number') resolve(line.child_port);
          } catch {
            // not a JSON line
          }
        }
      });
      child.on('exit', (code) => reject(new Error(`control plane child exited (${code})`)));
    });
    return {
      port,
      lines,
      kill: async () => {
        child.kill('SIGKILL');
        await exited;
        children.delete(child);
      },
    };
  };
  const until = async (check: () => Promise<boolean> | boolean, ms = 15_000) => {
    const end = Date.now() + ms;
    while (Date.now() < end) {
      if (await check()) return true;
      await new Promise((r) => setTimeout(r, 50));
    }
    return false;
  };
  const pending = async () =>
    (
      await db.query<{ step: string; client_id: string; client_name: string; cause: string }>(
        'SELECT step, client_id, client_name, cause FROM idp_pending_undo ORDER BY id',
      )
    ).rows;

  t.test('killed between the registration and the commit: the next start removes the orphan client', async (t) => {
    const first = await startChild();
    t.equal((await h.callAt(first.port, 'root', 'POST', '/orgs', { id: 'org-a', name: 'A' })).status, 201);
    const before = h.issuer.registeredClients();
    // The account's insert waits behind a lock: the process is mid-change, past the registration.
    const blocker = new pg.Client({ connectionString: pgDb.dsn });
    await blocker.connect();
    await blocker.query('BEGIN');
    await blocker.query('LOCK TABLE service_accounts IN EXCLUSIVE MODE');
    const call = h
      .callAt(first.port, 'root', 'POST', '/orgs/org-a/service-accounts', { name: 'orphan' })
      .catch((err: Error) => err);
    t.ok(
      await until(async () => (await pending()).some((p) => p.client_id !== '')),
      'the registration is on record before the account is stored',
    );
    t.equal(h.issuer.registeredClients(), before + 1, 'the client exists at the IdP');
    await first.kill();
    t.type(await call, Error, 'the call dies with the process');
    await blocker.query('ROLLBACK');
    await blocker.end();
    const [row] = await pending();
    t.match(
      row,
      { step: 'remove', client_id: /\S/, client_name: 'orphan', cause: 'in progress' },
      'the crash left the intent',
    );
    t.same((await db.query('SELECT id FROM service_accounts')).rows, [], 'and no account');

    const second = await startChild();
    t.teardown(second.kill);
    t.ok(
      await until(async () => (await pending()).length === 0),
      'the restarted process took the row over once its grace passed',
    );
    t.equal(h.issuer.registeredClients(), before, 'the orphan client is gone from the IdP');
    t.ok(
      await until(() =>
        second.lines.some(
          (l) =>
            l.action === 'service-account.idp-undo' &&
            l.outcome === 'allow' &&
            l.resource === `idp-client:${row.client_id}`,
        ),
      ),
      'and the undo is audited',
    );

    // A row whose account did commit (the undo runs against the store's state): nothing is removed.
    const kept = await h.callAt(second.port, 'root', 'POST', '/orgs/org-a/service-accounts', { name: 'kept' });
    t.equal(kept.status, 201);
    t.same(await pending(), [], 'a committed change settles its intent in its own transaction');
    const account = (
      await db.query('SELECT registration_client_uri, registration_access_token FROM service_accounts WHERE id = $1', [
        kept.body.id,
      ])
    ).rows[0];
    await db.query(
      `INSERT INTO idp_pending_undo (step, org_id, client_id, client_name, registration_client_uri, registration_access_token, cause) VALUES ('remove', 'org-a', $1, 'kept', $2, $3, 'in progress')`,
      [kept.body.id, account.registration_client_uri, account.registration_access_token],
    );
    t.ok(await until(async () => (await pending()).length === 0), 'the sweep settles a row of a committed account');
    t.equal(h.issuer.registeredClients(), before + 1, 'without removing its client');
    const key = parseServiceAccountKey(kept.body.credential);
    const token = await fetch(`${h.issuer.issuer}/token`, {
      method: 'POST',
      headers: { 'content-type': 'application/x-www-form-urlencoded' },
      body: await tokenRequestForm(key, { resource: AUDIENCE, scope: 'api' }),
    });
    t.equal(token.status, 200, 'the committed account still authenticates at the IdP');
  });

  t.test('killed during the registration: the interrupted registration is reported and audited', async (t) => {
    const third = await startChild();
    const before = h.issuer.registeredClients();
    h.issuer.holdRegistrations();
    const call = h
      .callAt(third.port, 'root', 'POST', '/orgs/org-a/service-accounts', { name: 'lost' })
      .catch((err: Error) => err);
    t.ok(await until(() => h.issuer.registeredClients() === before + 1), 'the IdP made the client');
    t.match(
      await pending(),
      [{ step: 'remove', client_id: '', client_name: 'lost' }],
      'its intent was on record first',
    );
    await third.kill();
    await call;
    h.issuer.releaseRegistrations();
    const fourth = await startChild();
    t.teardown(fourth.kill);
    t.ok(await until(async () => (await pending()).length === 0), 'the row is taken over');
    t.ok(
      await until(() =>
        fourth.lines.some(
          (l) =>
            l.action === 'service-account.idp-undo' &&
            l.outcome === 'deny' &&
            l.resource === 'idp-client-name:lost' &&
            /interrupted before its client id was recorded/.test(String(l.reason)),
        ),
      ),
      'reported in the audit for the operator',
    );
    t.ok(
      fourth.lines.some((l) =>
        l.level === 'error' || l.level === 50 ? /check the IdP for an orphan client/.test(String(l.msg)) : false,
      ),
      'and logged',
    );
  });

  t.test('an undo done whose row cannot be deleted keeps the original error', async (t) => {
    // The account's audit record never becomes durable (503); the undo removes the client; deleting
    // the pending row then fails: the caller still gets the 503, and the row stays for the sweep. (The
    // trigger refuses only the delete after an undo, which has recorded its cause, not the commit's.)
    let stall = false;
    const sink: AuditSink = {
      append: () => (stall ? new Promise(() => {}) : Promise.resolve()),
      flush: async () => {},
      close: async () => {},
    };
    const cp = await h.start({ seedAdmin: ['root'], auditCaptureTimeout: 300, databaseDsn: pgDb.dsn }, sink);
    t.teardown(() => cp.close());
    await h.callAt(cp.port, 'root', 'POST', '/orgs', { id: 'org-a', name: 'A' }); // 409 after the tests above
    await db.query(
      `CREATE FUNCTION refuse_delete() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN IF OLD.cause <> 'in progress' THEN RAISE EXCEPTION 'deletes refused'; END IF; RETURN OLD; END $$`,
    );
    await db.query(
      'CREATE TRIGGER refuse_delete BEFORE DELETE ON idp_pending_undo FOR EACH ROW EXECUTE FUNCTION refuse_delete()',
    );
    t.teardown(() => db.query('DROP TRIGGER IF EXISTS refuse_delete ON idp_pending_undo'));
    const before = h.issuer.registeredClients();
    stall = true;
    const refused = await h.callAt(cp.port, 'root', 'POST', '/orgs/org-a/service-accounts', { name: 'ghost' });
    stall = false;
    t.equal(refused.status, 503, 'the original error');
    t.match(refused.body, { detail: /audit/ });
    t.equal(h.issuer.registeredClients(), before, 'the client was removed');
    t.match(
      await pending(),
      [{ step: 'remove', client_name: 'ghost', client_id: /\S/ }],
      'the row stays for the sweep, which repeats the undo',
    );
  });
}
