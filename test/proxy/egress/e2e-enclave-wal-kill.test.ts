import type { ChildProcessWithoutNullStreams } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import tls from 'node:tls';
import pg from 'pg';
import t from 'tap';
import { Agent, request } from 'undici';
import { generateCa, issueCertificate } from '../../../core/tls.ts';
import { tokenIssuer } from '../../fixtures/agent-identity.ts';
import { until } from '../../fixtures/eventually.ts';
import { freshPgDatabase } from '../../fixtures/pg-database.ts';
import { startTcpProxy } from '../../fixtures/tcp-proxy.ts';
import { type DvxChild, startDvx } from './e2e-enclave-fixture.ts';
import { baseSnapshot, startEcho } from './gateway-harness.ts';

// P11 end to end: the network_flow records survive a SIGKILL of the gateway. `dvx serve gateway` (the
// real binary, a child process) with --audit-dsn (PostgreSQL, through a relay the test can cut) and
// --audit-wal-dir carries a few hundred tunnels; once the child's own metrics say every one of their
// records is durable in the WAL, it is killed with SIGKILL:
//
//   1. the store reachable (some records shipped, some not yet, a batch perhaps shipped and not yet
//      checkpointed), killed while more tunnels are still running;
//   2. the store cut off: everything waits in the WAL; killed again while tunnels run;
//   3. the store back, the gateway started again on the same WAL dir: it recovers the WAL and ships.
//
// Every flow that ended before a kill is then in the store exactly once (no duplicates), found by its
// bytes (each tunnel sends a line of its own length) and the agent's source port; the flows cut by a kill
// are there at most once each.

t.setTimeout(240_000);

const db = await freshPgDatabase('dvx_e2e_gateway_wal');
if (!db) {
  t.comment('no PostgreSQL at 127.0.0.1:5432: the durability test needs one');
} else {
  t.teardown(() => db.drop());
  const dir = await mkdtemp(join(tmpdir(), 'dvx-e2e-wal-kill-'));
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  const file = (name: string) => join(dir, name);
  const ca = await generateCa('gateway wal-kill CA');
  const leaf = await issueCertificate(ca, {
    commonName: 'localhost',
    dnsNames: ['localhost'],
    ipAddresses: ['127.0.0.1'],
  });
  await writeFile(file('cert.pem'), leaf.certPem);
  await writeFile(file('key.pem'), leaf.keyPem);
  const issuer = await tokenIssuer();
  await writeFile(file('jwks.json'), JSON.stringify(issuer.jwks));
  await writeFile(file('snapshot.json'), JSON.stringify(baseSnapshot()));
  // Platform tokens live 5 minutes at most: a fresh one for each start of the gateway.
  let token = '';

  const relay = await startTcpProxy(5432);
  t.teardown(() => relay.close());
  const dsnVia = db.dsn.replace('127.0.0.1:5432', `127.0.0.1:${relay.port}`);
  const echo = await startEcho();
  t.teardown(() => echo.close());
  const metricsClient = new Agent({ connect: { ca: ca.certPem, servername: 'localhost' } });
  t.teardown(() => metricsClient.close());
  const children = new Set<ChildProcessWithoutNullStreams>();
  t.teardown(() => {
    for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
  });

  interface Gateway {
    child: ChildProcessWithoutNullStreams;
    port: number;
    metricsPort: number;
    logs: Record<string, unknown>[];
    exited: DvxChild['exited'];
  }

  async function startGateway(): Promise<Gateway> {
    token = await issuer.mint();
    const { child, lines, ready, exited } = await startDvx(
      [
        'serve',
        'gateway',
        '--addr',
        '127.0.0.1:0',
        '--metrics-addr',
        '127.0.0.1:0',
        '--tls-cert',
        file('cert.pem'),
        '--tls-key',
        file('key.pem'),
        '--agent-jwks',
        file('jwks.json'),
        '--policy-snapshot',
        file('snapshot.json'),
        '--audit-dsn',
        dsnVia,
        '--audit-wal-dir',
        file('wal'),
        '--max-connections-per-client',
        '1000',
        // One process: the test SIGKILLs the process that appends (a primary's workers would stop
        // gracefully instead) and reads its metrics from its own listening line.
        '--workers',
        '1',
      ],
      'gateway listening',
    );
    children.add(child);
    return {
      child,
      port: (ready.addr as { port: number }).port,
      metricsPort: ready.metrics_port as number,
      logs: lines,
      exited,
    };
  }

  /** Records the child's WAL made durable (its own metric: dvx_audit_wal_durable_seconds_count). */
  async function durableFlows(gw: Gateway): Promise<number> {
    const res = await request(`https://127.0.0.1:${gw.metricsPort}/metrics`, { dispatcher: metricsClient });
    const text = await res.body.text();
    const m = /^dvx_audit_wal_durable_seconds_count\{table="network_flow"\} (\d+)/m.exec(text);
    return m ? Number(m[1]) : 0;
  }

  /** Every tunnel's source port (the record's `src`), by its number. */
  const sources = new Map<number, number>();
  let serial = 0;
  /** The length of tunnel n's line: its record's `bytes_up`, which names it (source ports may be reused). */
  const lineBytes = (n: number) => 64 + n;

  /**
   * One agent tunnel through the gateway to the echo server: CONNECT, a line each way, then closed by the
   * agent. Resolves with the tunnel's number once the gateway closed its side.
   */
  function tunnel(gw: Gateway): Promise<number> {
    const n = serial++;
    return new Promise((resolve, reject) => {
      let src = 0;
      const socket = tls.connect({ host: '127.0.0.1', port: gw.port, ca: ca.certPem, servername: 'localhost' }, () => {
        src = socket.localPort ?? 0;
        sources.set(n, src);
        socket.write(
          `CONNECT 127.0.0.1:${echo.port} HTTP/1.1\r\nHost: 127.0.0.1:${echo.port}\r\n` +
            `Proxy-Authorization: Bearer ${token}\r\n\r\n`,
        );
      });
      const timer = setTimeout(() => socket.destroy(new Error(`tunnel ${n}: no end within 20 s`)), 20_000);
      const line = `tunnel ${n} `.padEnd(lineBytes(n) - 1, '.') + '\n';
      let got = '';
      let open = false;
      socket.on('data', (d: Buffer) => {
        got += d.toString('latin1');
        if (!open) {
          const end = got.indexOf('\r\n\r\n');
          if (end < 0) return;
          if (!got.startsWith('HTTP/1.1 200')) return socket.destroy(new Error(`tunnel ${n}: ${got.split('\r\n')[0]}`));
          open = true;
          got = got.slice(end + 4);
          socket.write(line);
        }
        if (got === line) socket.end();
      });
      socket.on('error', (err) => {
        clearTimeout(timer);
        reject(err);
      });
      socket.on('close', () => {
        clearTimeout(timer);
        if (got === line) resolve(n);
        else reject(new Error(`tunnel ${n}: closed after ${JSON.stringify(got)}`));
      });
    });
  }

  /** `count` tunnels, `parallel` at a time: the numbers of the ones that completed. */
  async function tunnels(gw: Gateway, count: number, parallel = 40): Promise<number[]> {
    const done: number[] = [];
    let started = 0;
    await Promise.all(
      Array.from({ length: parallel }, async () => {
        while (started++ < count) done.push(await tunnel(gw));
      }),
    );
    return done;
  }

  /** Tunnels opened one after another until `stop` is set: some are cut by the kill. */
  function background(gw: Gateway): { stop: () => Promise<void> } {
    let stopped = false;
    const loops = Array.from({ length: 8 }, async () => {
      while (!stopped) await tunnel(gw).catch(() => {});
    });
    return {
      stop: async () => {
        stopped = true;
        await Promise.all(loops);
      },
    };
  }

  async function kill(gw: Gateway): Promise<void> {
    gw.child.kill('SIGKILL');
    const { signal } = await gw.exited;
    if (signal !== 'SIGKILL') throw new Error(`the gateway exited otherwise: ${signal}`);
  }

  const ended: number[][] = [];

  t.test('the store reachable: a few hundred tunnels, then SIGKILL while more run', async (t) => {
    const gw = await startGateway();
    const done = await tunnels(gw, 300);
    t.equal(done.length, 300, 'every tunnel carried its line');
    ended.push(done);
    t.ok(await until(async () => (await durableFlows(gw)) >= 300, 30_000), 'their records are durable in the WAL');
    const more = background(gw);
    t.ok(await until(async () => (await durableFlows(gw)) >= 320, 30_000), 'more tunnels under way');
    await kill(gw);
    await more.stop();
  });

  t.test('the store cut off: the records wait in the WAL; SIGKILL again', async (t) => {
    await relay.cut();
    const gw = await startGateway();
    t.ok(
      gw.logs.some((l) => l.msg === 'audit store unreachable at start; spooling to the WAL'),
      'it starts without its store',
    );
    const done = await tunnels(gw, 200);
    t.equal(done.length, 200, 'every tunnel carried its line');
    ended.push(done);
    t.ok(await until(async () => (await durableFlows(gw)) >= 200, 30_000), 'durable in the WAL');
    const more = background(gw);
    t.ok(await until(async () => (await durableFlows(gw)) >= 220, 30_000), 'more tunnels under way');
    await kill(gw);
    await more.stop();
  });

  t.test('restarted on the same WAL dir: every ended flow in the store, once', async (t) => {
    const client = new pg.Client({ connectionString: db.dsn });
    await client.connect();
    t.teardown(() => client.end());
    const expected = ended.flat();
    interface Row {
      id: string;
      src: string;
      outcome: string;
      dst_port: number;
      action: string;
      attrs: Record<string, string>;
    }
    const rows = async () =>
      (
        await client.query<Row>(
          `SELECT id, src, outcome, dst_port, action, attrs FROM audit_events WHERE kind = 'network_flow'`,
        )
      ).rows;
    const tunnelOf = (r: Row) => Number(r.attrs.bytes_up) - lineBytes(0);
    const stored = (r: Row[]) => new Set(r.map(tunnelOf));
    const before = stored(await rows());
    t.ok(
      ended[1].every((n) => !before.has(n)),
      'the flows of the second run were only in the WAL when it was killed',
    );

    await relay.restore();
    const gw = await startGateway();
    t.teardown(async () => {
      if (gw.child.exitCode === null) gw.child.kill('SIGTERM');
      await gw.exited;
    });
    t.ok(
      await until(async () => {
        const have = stored(await rows());
        return expected.every((n) => have.has(n));
      }, 60_000),
      `all ${expected.length} flows that ended before a kill reach the store`,
    );
    // What the WAL held is shipped whole (nothing more to come): its unshipped bytes are none.
    t.ok(
      await until(async () => {
        const res = await request(`https://127.0.0.1:${gw.metricsPort}/metrics`, { dispatcher: metricsClient });
        return /^dvx_audit_wal_unshipped_bytes\{table="network_flow"\} 0$/m.test(await res.body.text());
      }, 60_000),
      'the recovered WAL is shipped',
    );
    const all = await rows();
    const ids = all.map((r) => r.id);
    t.equal(new Set(ids).size, ids.length, 'no record twice');
    const byTunnel = new Map<number, Row[]>();
    for (const r of all) byTunnel.set(tunnelOf(r), [...(byTunnel.get(tunnelOf(r)) ?? []), r]);
    t.same(
      expected.filter((n) => byTunnel.get(n)?.length !== 1),
      [],
      'each ended flow exactly once',
    );
    t.same(
      expected.filter((n) => byTunnel.get(n)?.[0].src !== `127.0.0.1:${sources.get(n)}`),
      [],
      'each with the agent source port',
    );
    t.same(
      [...byTunnel].filter(([, rs]) => rs.length !== 1).map(([n]) => n),
      [],
      'a flow cut by a kill is there once, if at all',
    );
    t.ok(all.length >= expected.length, `${all.length} flows stored (${all.length - expected.length} cut by a kill)`);
    t.ok(
      all.every((r) => r.action === 'connect' && r.dst_port === echo.port && r.outcome === 'allow'),
      'whole records, as the gateway wrote them',
    );

    // Still a working gateway: a new tunnel, its record shipped as usual.
    const [last] = await tunnels(gw, 1, 1);
    t.ok(await until(async () => stored(await rows()).has(last), 30_000), 'a new flow after the recovery');
    gw.child.kill('SIGTERM');
    t.same(await gw.exited, { code: 0, signal: null }, 'a clean stop');
  });
}
