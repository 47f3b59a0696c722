import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import tls from 'node:tls';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { ProxyAgent } from 'undici';
import { generateCa, type PemPair } from '../../../core/tls.ts';
import type { GatewayOptions } from '../../../proxy/egress/options.ts';
import { gatewayKey, type GatewayKey } from '../../fixtures/gateway-key.ts';
import { startHarness as startLlmproxy, type Harness as LlmproxyHarness } from '../../fixtures/llmproxy-harness.ts';
import { until } from '../../fixtures/eventually.ts';
import { startGatewayHarness, type GatewayHarness } from './gateway-harness.ts';

// The whole LLM path, every part real and in one process: an agent's official SDK pointed at the
// provider's public URL (no baseURL) and sent through the gateway with undici's ProxyAgent; the gateway
// (TLS listener, JWT, interception CA, --llmproxy-addr, --gateway-key) routing api.anthropic.com and
// api.openai.com to a real llmproxy (--gateway-key: the public half), which answers from the node:http
// upstream of test/fixtures/llm-upstream.ts. Both audit streams are read back: llmproxy's
// llm_audit_log records and the gateway's network_flow records.

/** The provider key the agent's SDK holds (a dummy: llmproxy's platform mode replaces it). */
export const AGENT_KEY = 'sk-ant-agent-dummy-key';

export interface LlmPath {
  dir: string;
  key: GatewayKey;
  /** The interception CA: the agent trusts it for api.anthropic.com (requestTls). */
  interceptCa: PemPair;
  llm: LlmproxyHarness;
  gw: GatewayHarness;
  /** A ProxyAgent through the gateway; `token` is the whole Proxy-Authorization value (null: none). */
  proxyAgent(token: string | null): ProxyAgent;
  /** The official Anthropic SDK at https://api.anthropic.com through `dispatcher`. */
  anthropic(dispatcher: ProxyAgent, extra?: { defaultHeaders?: Record<string, string> }): Anthropic;
  /** The official OpenAI SDK at https://api.openai.com through `dispatcher`. */
  openai(dispatcher: ProxyAgent): OpenAI;
  /**
   * One raw HTTP/1.1 exchange inside a tunnel to `host:443` the gateway terminates: CONNECT with
   * `token`, TLS to `host` trusting the interception CA, `bytes` written; resolves with everything read
   * until the connection closes (10 s at most), or with the CONNECT's answer when it is not 200.
   */
  rawInTunnel(token: string, host: string, bytes: Buffer | string): Promise<string>;
  /** The gateway's network_flow records so far. */
  flows(): Record<string, unknown>[];
  /** llmproxy's audit records (llm_audit_log) so far. */
  llmRecords(): Record<string, unknown>[];
  /** Waits until `check` holds on the flows (20 s); throws when it does not. */
  flowsUntil(check: (flows: Record<string, unknown>[]) => boolean): Promise<Record<string, unknown>[]>;
  close(): Promise<void>;
}

export async function startLlmPath(
  options: {
    gateway?: Partial<GatewayOptions>;
    /** Where the gateway sends LLM calls, in place of the llmproxy started here (one that is down). */
    llmproxyAddr?: string;
    /** llmproxy's policy snapshot, in place of the harness's. */
    llmSnapshot?: (upstreamUrl: string) => unknown;
    /** llmproxy's (and the gateway's) secrets file, in place of the harness's. */
    llmSecrets?: unknown;
  } = {},
): Promise<LlmPath> {
  const dir = await mkdtemp(join(tmpdir(), 'dvx-e2e-llm-'));
  const agents: ProxyAgent[] = [];
  let llm: LlmproxyHarness | undefined;
  let gw: GatewayHarness | undefined;
  let key: GatewayKey;
  let interceptCa: PemPair;
  try {
    key = await gatewayKey(dir);
    interceptCa = await generateCa('e2e interception CA');
    await writeFile(join(dir, 'intercept-ca.pem'), interceptCa.certPem);
    await writeFile(join(dir, 'intercept-ca-key.pem'), interceptCa.keyPem, { mode: 0o600 });
    llm = await startLlmproxy({
      proxy: { gatewayKey: key.publicPath },
      snapshot: options.llmSnapshot,
      secrets: options.llmSecrets,
    });
    gw = await startGatewayHarness({
      gateway: {
        caCert: join(dir, 'intercept-ca.pem'),
        caKey: join(dir, 'intercept-ca-key.pem'),
        llmproxyAddr: options.llmproxyAddr ?? llm.url,
        gatewayKey: key.privatePath,
        // llmproxy's certificate (and any test destination's: startHttps(llm.ca)) is of this CA.
        upstreamCa: join(llm.dir, 'ca.pem'),
        // The same secrets as llmproxy's: the gateway redacts them from what it records.
        secretsFile: join(llm.dir, 'secrets.json'),
        ...options.gateway,
      },
    });
  } catch (err) {
    await llm?.close();
    await rm(dir, { recursive: true, force: true });
    throw err;
  }
  const g = gw;
  const l = llm;
  const flows = () => g.audit.filter((r) => r.table === 'network_flow');
  return {
    dir,
    key,
    interceptCa,
    llm: l,
    gw: g,
    proxyAgent(token) {
      const agent = new ProxyAgent({
        uri: g.proxyUrl,
        ...(token === null ? {} : { token }),
        // The gateway's certificate names localhost (an IP is no TLS server name).
        proxyTls: { ca: g.ca.certPem, servername: 'localhost' },
        requestTls: { ca: interceptCa.certPem },
      });
      agents.push(agent);
      return agent;
    },
    anthropic: (dispatcher, extra = {}) =>
      new Anthropic({
        apiKey: AGENT_KEY,
        maxRetries: 0,
        timeout: 20_000,
        fetchOptions: { dispatcher },
        ...extra,
      }),
    openai: (dispatcher) =>
      new OpenAI({ apiKey: AGENT_KEY, maxRetries: 0, timeout: 20_000, fetchOptions: { dispatcher } }),
    rawInTunnel: (token, host, bytes) =>
      new Promise((resolve, reject) => {
        const outer = tls.connect({ host: '127.0.0.1', port: g.port, ca: g.ca.certPem, servername: 'localhost' }, () =>
          outer.write(`CONNECT ${host}:443 HTTP/1.1\r\nHost: ${host}:443\r\nProxy-Authorization: ${token}\r\n\r\n`),
        );
        const timer = setTimeout(() => outer.destroy(), 10_000);
        let head = '';
        const onHead = (d: Buffer) => {
          head += d.toString('latin1');
          if (!head.includes('\r\n\r\n')) return;
          outer.off('data', onHead);
          if (!head.startsWith('HTTP/1.1 200 ')) {
            clearTimeout(timer);
            outer.destroy();
            resolve(head);
            return;
          }
          const inner = tls.connect({ socket: outer, servername: host, ca: interceptCa.certPem }, () =>
            inner.write(bytes),
          );
          let got = '';
          inner.on('data', (x: Buffer) => (got += x.toString('latin1')));
          inner.on('error', () => undefined);
          inner.on('close', () => {
            clearTimeout(timer);
            resolve(got);
          });
        };
        outer.on('data', onHead);
        outer.on('error', (err) => {
          clearTimeout(timer);
          reject(err);
        });
      }),
    flows,
    llmRecords: () => l.audit.filter((r) => r.table === 'llm_audit_log'),
    async flowsUntil(check) {
      if (!(await until(() => check(flows())))) throw new Error('the expected network_flow records did not arrive');
      return flows();
    },
    async close() {
      await Promise.all(agents.map((a) => a.close().catch(() => undefined)));
      await g.close();
      await l.close();
      await rm(dir, { recursive: true, force: true });
    },
  };
}
