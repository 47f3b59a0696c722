import t from 'tap';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { Agent, request } from 'undici';
import { DVX_BIN, runDvx } from '../fixtures/run-dvx.ts';
import { tlsDir } from '../fixtures/tls-dir.ts';

// `dvx serve controlplane` takes the common server flags (spec: Server components, "Common flags"):
// --metrics-addr opens the TLS Prometheus listener, --enclave-id / --enclave-name (or DVX_*) mark every
// log line and /healthz. The real binary in skeleton mode (no issuer, no database).
const tls = await tlsDir('dvx-cli-cp-');
t.teardown(() => tls.remove());
const dispatcher = new Agent({ connect: { ca: tls.ca.certPem } });
t.teardown(() => dispatcher.close());

t.test('--metrics-addr answers /metrics; --enclave-name and DVX_ENCLAVE_ID reach the logs and /healthz', async (t) => {
  const env: Record<string, string | undefined> = { ...process.env, DVX_ENCLAVE_ID: 'enc-7' };
  for (const k of Object.keys(env)) if (k.startsWith('DVX_') && k !== 'DVX_ENCLAVE_ID') delete env[k];
  const child = spawn(
    DVX_BIN,
    [
      'serve',
      'controlplane',
      '--addr',
      '127.0.0.1:0',
      '--tls-cert',
      tls.cert,
      '--tls-key',
      tls.key,
      '--metrics-addr',
      '127.0.0.1:0',
      '--enclave-name',
      'edge one',
    ],
    { env, stdio: ['ignore', 'pipe', 'pipe'] },
  );
  t.teardown(() => child.kill('SIGKILL'));
  let out = '';
  const listening = new Promise<Record<string, unknown>>((resolve, reject) => {
    child.stdout.on('data', (d) => {
      out += d;
      const line = out.split('\n').find((l) => l.includes('"controlplane listening"'));
      if (line) resolve(JSON.parse(line) as Record<string, unknown>);
    });
    child.on('close', (code) => reject(new Error(`exited ${code} before listening: ${out}`)));
  });
  const line = await listening;
  t.equal(line.enclave_id, 'enc-7', 'DVX_ENCLAVE_ID on the log line');
  t.equal(line.enclave_name, 'edge one', '--enclave-name on the log line');
  t.type(line.metrics_port, 'number');
  const metrics = await request(`https://127.0.0.1:${line.metrics_port as number}/metrics`, { dispatcher });
  t.equal(metrics.statusCode, 200);
  t.match(await metrics.body.text(), /dvx_/, "the control plane's metrics");
  const port = (line.addr as { port: number }).port;
  const health = await request(`https://127.0.0.1:${port}/healthz`, { dispatcher });
  t.match(await health.body.json(), {
    component: 'controlplane',
    status: 'ok',
    enclave_id: 'enc-7',
    enclave_name: 'edge one',
  });
  child.kill('SIGTERM');
  await once(child, 'close');
});

t.test('the help lists the common flags with their DVX_* variables', async (t) => {
  const help = (await runDvx(['serve', 'controlplane', '--help'])).stdout.replace(/\s+/g, ' ');
  t.match(help, /--metrics-addr <addr> .*?env: DVX_METRICS_ADDR\)/);
  t.match(help, /--enclave-id <id> .*?env: DVX_ENCLAVE_ID\)/);
  t.match(help, /--enclave-name <name> .*?env: DVX_ENCLAVE_NAME\)/);
});
