import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';
import { performance } from 'node:perf_hooks';
import type { Logger } from '../../core/logger.ts';
import { newId } from '../../core/ids.ts';
import type { AuditSink } from '../../audit-wal/sink.ts';
import type { CaptureOptions } from '../../audit-wal/gate.ts';
import type { InspectionEngine } from '../../pipeline/engine.ts';
import type { Finding } from '../../pipeline/finding.ts';
import type { PolicyCache } from '../../pipeline/policy/cache.ts';
import type { Snapshot } from '../../pipeline/policy/snapshot.ts';
import type { ResolvedPolicy } from '../../pipeline/policy/types.ts';
import type { Rule } from '../../pipeline/policy/governance.ts';
import type { AgentAuthenticator, AgentIdentity } from '../llm/auth.ts';
import type { SecretSource } from '../llm/secrets-file.ts';
import type { GatewayOptions } from './options.ts';
import type { InjectRule } from './inject-cred.ts';
import type { GatewayMetrics } from './metrics.ts';
import type { BoundedLookup } from './lookup-limits.ts';

// What the gateway's parts share (docs/gateway.md): the dependencies built once at start, the
// destination an agent asked for, and the flow — one attempt (a CONNECT tunnel, or one plain-HTTP
// request) — whose fields become its `network_flow` record (flow-record.ts).
//
//   gateway.ts       the listener's two doors: CONNECT and absolute-form requests; identity (407),
//                    agent state, destination policy (destination.ts, resolve.ts), blind tunnels
//   intercept.ts     a tunnel whose TLS the gateway terminates (leaf per SNI, leaf-issuer.ts); each
//                    request inside is an Exchange
//   exchange.ts      one HTTP request forwarded: capture, inspection, credential injection, and the
//                    route (the destination, llmproxy for --llm-host, the control plane for --cp-api-host)
//   llmproxy-route.ts, operator-tokens.ts, inject-cred.ts   what exchange.ts uses for those routes
//   lookup-limits.ts  name lookups bounded (thread pool share, one per agent, queue, deadline)

/** Where an agent asked to go: the CONNECT authority or the absolute-form URL's. */
export interface Target {
  /** As the rules compare it: lower case, no brackets (host-match.ts canonicalHost). */
  host: string;
  port: number;
}

/** The destination as checked: the address the connection goes to is the one the policy admitted. */
export interface PinnedTarget extends Target {
  address: string;
  family: 4 | 6;
}

/** The resolved destination rules of one agent: deny rules union; each allow list is a gate (destination.ts). */
export interface DestinationGates {
  allow: { source: 'policy' | '--allow-dest'; rules: readonly Rule[] }[];
  deny: readonly Rule[];
}

export type FlowProto = 'tcp' | 'http' | 'https';

/** One attempt. Every field is set in the constructor, so every flow has the same shape. */
export class Flow {
  readonly id = newId();
  readonly started = performance.now();
  readonly startedAt = new Date();
  /** `tcp`: a blind tunnel; `http`: an absolute-form request; `https`: a request inside a terminated tunnel. */
  proto: FlowProto;
  /** The client's address and port, and address. */
  src: string;
  srcIp: string;
  /** What the agent asked for (`host:port`), its host and port, and the address it went to. */
  dst: string;
  dstHost: string;
  dstPort: number;
  dstIp = '';
  identity: AgentIdentity | null = null;
  outcome: 'allow' | 'deny' = 'allow';
  reason = '';
  /** Bytes from the agent to the destination, and back (bodies and tunnel bytes, not our own answers). */
  bytesUp = 0;
  bytesDown = 0;
  /** What an exchange adds (docs/gateway.md, "The network_flow record"): method, url, status, capture. */
  attrs: Record<string, string> = {};
  findings: Finding[] = [];
  /** The record was already appended. */
  recorded = false;
  /**
   * Why the gateway cut this flow while it was open (a snapshot reload that now refuses it, the end of
   * the shutdown grace); null when it was not. The first cut wins and overrides the outcome and reason
   * the flow's own ending would give (flow-record.ts): cut twice, it is still one record with one reason.
   */
  cutReason: string | null = null;
  /** Settles once the record has been handed to the audit sink and the sink has taken it (or failed). */
  readonly written: Promise<void>;
  /** Settles `written`; called by recordFlow. */
  settleWritten: () => void = () => {};

  constructor(proto: FlowProto, src: { address: string; port: number }, target: Target) {
    this.written = new Promise<void>((resolve) => {
      this.settleWritten = resolve;
    });
    this.proto = proto;
    this.src = `${src.address}:${src.port}`;
    this.srcIp = src.address;
    this.dstHost = target.host;
    this.dstPort = target.port;
    this.dst = `${target.host.includes(':') ? `[${target.host}]` : target.host}:${target.port}`;
  }
}

export interface GatewayDeps {
  options: GatewayOptions;
  auth: AgentAuthenticator;
  snapshot: () => Snapshot;
  policies: PolicyCache<ResolvedPolicy>;
  secrets: SecretSource;
  engine: InspectionEngine;
  audit: AuditSink;
  /** Authority-gated effects (an injected credential, an agent-operator token) wait for their record. */
  capture: Omit<CaptureOptions, 'log'>;
  log: Logger;
  metrics: GatewayMetrics;
  version: string;
  /** --allow-dest (one more gate) and --deny-dest rules, parsed. */
  cliRules: { allow: Rule[]; deny: Rule[] };
  injectRules: readonly InjectRule[];
  /** Extra CA bundle trusted for TLS the gateway originates (--upstream-ca), with the system's. */
  upstreamCa: Buffer | undefined;
  /**
   * Resolves a name to every address, bounded (lookup-limits.ts): a global cap on lookups running in
   * libuv's thread pool, one at a time per agent, a deadline. The system lookup underneath is injected
   * so a test can name what a host resolves to.
   */
  lookup: BoundedLookup;
  /** Terminates a tunnel's TLS and serves the requests inside (intercept.ts); null without --ca-cert. */
  interceptor: Interceptor | null;
  /** Forwards one HTTP request (exchange.ts). */
  exchange: ExchangeHandler;
  /** --llmproxy-addr: where --llm-host requests go, with signed identity headers; null: not set. */
  llmproxy: LlmproxyRoute | null;
  /** --cp-api-host: the agent-operator tokens its requests carry; null: not set. */
  operatorTokens: OperatorTokenSource | null;
  /**
   * How long requests in flight in an intercepted tunnel may still take once its credential ended
   * (gateway.ts RETIRE_GRACE_MS unless set: GatewayStart.retireGraceMs).
   */
  retireGraceMs?: number;
}

/** Where an exchange is sent instead of its destination, and the headers that go with it. */
export interface RoutedUpstream {
  /** The origin requests go to (`https://host:port`), and the dispatcher that trusts it. */
  origin: string;
  dispatcher: import('undici').Dispatcher;
  /** Headers set on the forwarded request (replacing the agent's of the same name). */
  headers: Record<string, string>;
}

/** llmproxy-route.ts: requests to --llm-host hosts go to llmproxy, vouched for by signed identity headers. */
export interface LlmproxyRoute {
  /** Whether `host` is one of --llm-host's. */
  matches(host: string): boolean;
  /** The route for this agent's request (the headers are signed for its method and path). */
  route(identity: AgentIdentity, method: string, path: string): Promise<RoutedUpstream>;
  close(): Promise<void>;
}

/** operator-tokens.ts: 60-second agent-operator tokens minted through the broker, cached until near expiry. */
export interface OperatorTokenSource {
  /** Whether `host:port` is --cp-api-host. */
  matches(host: string, port: number): boolean;
  /** The bearer token for this agent; throws OperatorTokenError (status 403: contained, refused at the mint). */
  token(identity: AgentIdentity): Promise<string>;
  close(): Promise<void>;
}

/** The interception of one allowed tunnel: the client's socket after `200 Connection Established`. */
export interface Interceptor {
  /**
   * Whether this tunnel's TLS is terminated: a --llm-host, --cp-api-host or --inject-cred host always
   * (they cannot be served otherwise), any other host when --http-capture is on and it is not a
   * --no-capture-host.
   */
  wants(target: Target): boolean;
  /**
   * Serves the tunnel (TLS, then HTTP/1.1 requests, each an Exchange); `tunnel` is the CONNECT's flow.
   * Resolves (never rejects) once the client's socket has closed and every request inside has been
   * answered: `tunnel`'s bytes and attrs are then final, and its opener records it.
   */
  serve(client: Duplex, head: Buffer, target: PinnedTarget, tunnel: Flow): Promise<void>;
  /**
   * The tunnel served on `client` is being cut (a reload refuses it, shutdown): each request still in
   * flight inside it gets `reason` as its record's; returns those flows (their records follow).
   */
  cut(client: Duplex, reason: string): Flow[];
  /**
   * The credential that admitted the tunnel on `client` ended: it takes no new request. Closed now when
   * nothing is in flight (true); else each request in flight finishes, answered with `connection:
   * close`, and the tunnel closes with the last (false). `graceMs` bounds that wait: past it the tunnel
   * is cut (`onOverdue`).
   */
  retire(client: Duplex, graceMs: number, onOverdue: () => void): boolean;
  close(): Promise<void>;
}

/**
 * One HTTP request to forward: an absolute-form request (scheme http) or one inside a terminated tunnel
 * (scheme https). The handler answers `res` in every case and appends `flow`'s record when it ends.
 */
export type ExchangeHandler = (
  req: IncomingMessage,
  res: ServerResponse,
  target: PinnedTarget,
  scheme: 'http' | 'https',
  flow: Flow,
) => void;
