import { STATUS_CODES, type IncomingMessage, type ServerResponse } from 'node:http';
import { isIP } from 'node:net';
import type { Duplex } from 'node:stream';
import type { TLSSocket } from 'node:tls';
import { decodeJwt } from 'jose';
import { agentStanding, RemovedAgents } from '../llm/agent-standing.ts';
import { CLOCK_TOLERANCE_S, certificateIdentity, type AgentIdentity } from '../llm/auth.ts';
import { AuthError } from '../llm/errors.ts';
import { governanceOf } from '../../pipeline/policy/snapshot-governance.ts';
import type { Snapshot } from '../../pipeline/policy/snapshot.ts';
import {
  type DestinationGates,
  Flow,
  type FlowProto,
  type GatewayDeps,
  type PinnedTarget,
  type Target,
} from './context.ts';
import { decideResolved, decideRouted, destinationGates, refuseByName } from './destination.ts';
import {
  ANSWERS,
  badProxyRequest,
  destinationRefused,
  GatewayRefusal,
  PROXY_AUTHENTICATE,
  type GatewayAnswer,
} from './errors.ts';
import { DeadlineQueue, type Deadline } from './deadline-queue.ts';
import { recordFlow } from './flow-record.ts';
import { canonicalHost } from './host-match.ts';
import { rulesFor } from './inject-cred.ts';
import { inTurn } from './pipelining.ts';
import { admitDestination, admitRouted } from './resolve.ts';
import { answerSocket, openTunnel } from './tunnel.ts';

// The gateway's two doors (docs/gateway.md): `CONNECT host:port` (node's 'connect' event) and an
// absolute-form `http://…` request ('request'). Anything else is a 400, but `GET /healthz`.
//
//   attempt ─▶ shutting down? 503 ─▶ identity: Proxy-Authorization Bearer JWT, else the mTLS certificate (407)
//           ─▶ standing in the snapshot: org, suspended / isolated / contained (403)
//           ─▶ the target, parsed strictly (400)
//           ─▶ destination: routed hosts (--llm-host, --cp-api-host) by name only; the rest resolved
//              once, every address checked, pinned (403 destination_denied, 502/504 resolution)
//           ─▶ CONNECT: intercepted (intercept.ts) or a blind tunnel (tunnel.ts)
//              absolute-form: one exchange (exchange.ts)
//
// What is open stays open only while it would still be admitted: a snapshot reload re-checks it
// (`recheck`), and it is cut when the credential that admitted it expires (a JWT's exp, a
// certificate's notAfter: one timer for all, deadline-queue.ts).
//
// A refusal is one GatewayRefusal, turned into its answer and its network_flow record in one place
// (#refuse). Proxy-Authorization is the gateway's alone: it never goes further. The agent's own
// Authorization header belongs to the destination and is not read here.

const HEALTH_PATH = '/healthz';
/** The longest target text kept in a refused flow's record. */
const MAX_RECORDED_TARGET = 256;
/** A CONNECT authority: a host name or IPv4 address, or an IPv6 address in brackets, then a port. */
const AUTHORITY = /^(?:\[([0-9a-f:.]+)\]|([a-z0-9_.-]+)):([0-9]{1,5})$/i;
const MAX_NAME = 253;
const MAX_LABEL = 63;
const BEARER = /^bearer[ \t]+([^\s]+)[ \t]*$/i;
const CONTROL = /[\u0000-\u0020\u007f]/;

/** The client's address as rules and records compare it: an IPv4-mapped IPv6 address is its IPv4 address. */
function clientAddress(socket: Duplex & { remoteAddress?: string; remotePort?: number }) {
  const a = socket.remoteAddress ?? '';
  return { address: a.startsWith('::ffff:') ? a.slice(7) : a, port: socket.remotePort ?? 0 };
}

function printable(text: string): string {
  return text.slice(0, MAX_RECORDED_TARGET).replace(/[\u0000-\u001f\u007f]/g, '?');
}

/**
 * A host as the rules compare it, whatever its spelling: lower case, no brackets, an IPv4 address in
 * dotted form (`0x7f.1` is 127.0.0.1, as a URL's host parser reads it), an IPv6 address compressed,
 * and an IPv4-mapped IPv6 address as its IPv4 address (so a rule naming 127.0.0.1 is not dodged by
 * `[::ffff:127.0.0.1]`).
 */
function parseHost(host: string): string | null {
  // Host characters only: the URL parser would read `denied@allowed` as `allowed` (userinfo) and
  // decode `%61`; a name is matched against the rules as the agent wrote it, or refused.
  if (!/^(?:\[[0-9a-f:.]+\]|[a-z0-9_.-]+)$/i.test(host)) return null;
  let parsed: string;
  try {
    parsed = new URL(`http://${host}/`).hostname;
  } catch {
    return null;
  }
  const h = canonicalHost(parsed);
  const mapped = /^::ffff:([0-9a-f]{1,4}):([0-9a-f]{1,4})$/.exec(h);
  if (mapped) {
    const [hi, lo] = [Number.parseInt(mapped[1], 16), Number.parseInt(mapped[2], 16)];
    return `${hi >> 8}.${hi & 255}.${lo >> 8}.${lo & 255}`;
  }
  if (h === '') return null;
  // A DNS name is at most 253 bytes in 63-byte labels (RFC 1035 2.3.4); anything longer is not a
  // name any resolver answers, only a way to make the gateway and its logs carry it.
  if (isIP(h) === 0 && (h.length > MAX_NAME || h.split('.').some((l) => l.length === 0 || l.length > MAX_LABEL)))
    return null;
  return h;
}

function parsePort(text: string): number | null {
  if (!/^[1-9][0-9]{0,4}$/.test(text)) return null;
  const port = Number(text);
  return port <= 65535 ? port : null;
}

/** `CONNECT host:port`'s target; throws a 400 GatewayRefusal naming what is wrong. */
export function connectTarget(authority: string): Target {
  const bad = (why: string): never => {
    throw new GatewayRefusal(badProxyRequest(`CONNECT target "${printable(authority)}": ${why}`), why);
  };
  if (CONTROL.test(authority)) bad('control characters or spaces are not allowed');
  const m = AUTHORITY.exec(authority);
  if (!m) bad('expected host:port (an IPv6 address in brackets: [2001:db8::1]:443)');
  const port = parsePort(m![3]);
  if (port === null) bad('the port must be 1..65535');
  if (m![1] !== undefined) {
    if (isIP(m![1]) !== 6) bad(`[${m![1]}] is not an IPv6 address`);
    return { host: parseHost(`[${m![1]}]`)!, port: port! };
  }
  const host = parseHost(m![2]);
  if (host === null) bad(`"${printable(m![2])}" is not a host name (at most 253 bytes, each label 1 to 63)`);
  return { host: host!, port: port! };
}

/** An absolute-form request's target (`http://host[:port]/…`); throws a 400 GatewayRefusal. */
export function absoluteTarget(rawUrl: string): Target {
  const bad = (why: string): never => {
    throw new GatewayRefusal(badProxyRequest(why), why);
  };
  if (CONTROL.test(rawUrl)) bad('control characters or spaces are not allowed in the request target');
  let url: URL;
  try {
    url = new URL(rawUrl);
  } catch {
    return bad('the request target is not an absolute URL');
  }
  if (url.protocol === 'https:')
    bad('https:// is not forwarded in absolute form: open a CONNECT tunnel (HTTPS_PROXY) for https');
  if (url.protocol !== 'http:')
    bad(`${url.protocol}// is not forwarded: only http:// in absolute form, and CONNECT tunnels`);
  if (url.username !== '' || url.password !== '' || /^[a-z]+:\/\/[^/?#]*@/i.test(rawUrl))
    bad('a URL with credentials (user:password@) is refused');
  const named = url.host.replace(/:\d*$/, '');
  if (named === '') bad('the URL names no host');
  const host = parseHost(named) ?? '';
  if (host === '') bad(`"${printable(named)}" is not a host name (at most 253 bytes, each label 1 to 63)`);
  const port = url.port === '' ? 80 : parsePort(url.port);
  if (port === null) bad('the port must be 1..65535');
  return { host, port: port! };
}

/**
 * The Host header must name the target: one Host header, its host the target's, its port (when given;
 * `defaultPort` when not, for absolute-form) the target's. Null when it agrees.
 */
export function hostHeaderProblem(rawHeaders: string[], target: Target, defaultPort: number | null): string | null {
  const values: string[] = [];
  for (let i = 0; i < rawHeaders.length; i += 2)
    if (rawHeaders[i].toLowerCase() === 'host') values.push(rawHeaders[i + 1]);
  if (values.length === 0) return null;
  if (values.length > 1) return 'more than one Host header';
  const value = values[0].trim();
  const m = /^(\[[0-9a-f:.]+\]|[a-z0-9_.-]+)(?::([0-9]*))?$/i.exec(value);
  const host = m ? parseHost(m[1]) : null;
  if (!m || host === null) return `the Host header "${printable(value)}" is not host[:port]`;
  const port = m[2] ? parsePort(m[2]) : defaultPort;
  if (host !== target.host || (port !== null && port !== target.port))
    return `the Host header "${printable(value)}" does not name the target ${target.host}:${target.port}`;
  return null;
}

/** Until when a credential admits, and what it is (for the reason of a flow it no longer admits). */
interface CredentialLifetime {
  /** The first instant (ms since the epoch) at which the credential is refused. */
  endsAt: number;
  /** `token expired at …` or `identity certificate expired at …`. */
  expired: string;
}

/**
 * Identity of an attempt and its credential's lifetime, or why there is none (the error's identity is
 * set when the token's signature verified).
 */
type Identified =
  | { identity: AgentIdentity; lifetime: CredentialLifetime; error: null }
  | { identity: AgentIdentity | null; lifetime: null; error: AuthError };

/** The record's reason for an attempt whose client left while it was being admitted. */
export const CLIENT_GONE = 'client went away';
/** Why what is still open when the shutdown grace ends is cut. */
const SHUTDOWN_CUT = 'the gateway is shutting down';
/** How long the records of what the shutdown cut (and of attempts still being admitted) are waited for. */
const RECORD_WAIT_MS = 5_000;
/**
 * Bytes a CONNECT's client may send while its attempt is admitted (kept for the tunnel); past them it
 * is not read until then. A socket's own high-water mark: no more than node would buffer unasked.
 */
const MAX_EARLY_BYTES = 16 * 1024;

/**
 * A flow the gateway let through that is still open (a tunnel, an absolute-form request in flight):
 * re-checked on every snapshot reload, cut at the end of the shutdown grace. It leaves the set once
 * its record is written.
 */
interface OpenFlow {
  flow: Flow;
  /** The identity as its credential proved it, before the snapshot completed it: re-checked as admitted. */
  credential: AgentIdentity;
  /** Until when that credential admits: the flow is cut then. */
  lifetime: CredentialLifetime;
  target: PinnedTarget;
  /**
   * Ends it now, both sides, its record saying why (the first cut's reason: cut twice, one record);
   * `answer` (with `headers`) for a tunnel not yet answered. Returns the flows inside it whose records
   * follow.
   */
  cut(reason: string, answer: GatewayAnswer, headers?: Record<string, string>): Flow[];
  /**
   * An intercepted tunnel whose credential ended: retired rather than cut (no new request; those in
   * flight finish within RETIRE_GRACE_MS, then it closes); absent for every other flow.
   */
  retire?(reason: string): void;
}

/**
 * How long the requests in flight in an intercepted tunnel may still take once the credential that
 * admitted the tunnel has ended (docs/decisions.md, "A flow ends with its credential"): one more
 * broker credential's lifetime. Past it they are cut.
 */
export const RETIRE_GRACE_MS = 5 * 60_000;

/** An attempt's client, watched while the attempt is admitted (identity, policy, the name lookup). */
interface ClientWatch {
  gone(): boolean;
  /** Aborted when the client leaves: a lookup waiting for a slot stops waiting. */
  signal: AbortSignal;
  /** Stops watching; returns what the client sent meanwhile after `head` (a CONNECT's), for the tunnel. */
  release(): Buffer;
}

/**
 * A CONNECT's socket is read while its attempt is admitted, so that a client that leaves (its FIN, its
 * reset) is seen: nothing is opened toward the destination for it. What it sends meanwhile (a TLS
 * ClientHello, sent eagerly) is kept, in order, up to MAX_EARLY_BYTES, then the socket is no longer read.
 */
function watchConnectClient(socket: Duplex, head: Buffer): ClientWatch {
  const controller = new AbortController();
  const chunks: Buffer[] = [head];
  let size = head.length;
  let gone = false;
  const leave = () => {
    if (gone) return;
    gone = true;
    controller.abort(new Error(CLIENT_GONE));
  };
  const onData = (chunk: Buffer) => {
    chunks.push(chunk);
    size += chunk.length;
    if (size >= MAX_EARLY_BYTES) socket.pause();
  };
  socket.on('data', onData);
  socket.once('end', leave);
  socket.once('close', leave);
  return {
    gone: () => gone || socket.destroyed,
    signal: controller.signal,
    release: () => {
      socket.off('data', onData);
      socket.off('end', leave);
      socket.off('close', leave);
      socket.pause();
      return chunks.length === 1 ? head : Buffer.concat(chunks);
    },
  };
}

/** An absolute-form request's client: gone once its response closed before being answered. */
function watchRequestClient(req: IncomingMessage, res: ServerResponse): ClientWatch {
  const controller = new AbortController();
  let gone = false;
  const leave = () => {
    if (gone) return;
    gone = true;
    controller.abort(new Error(CLIENT_GONE));
  };
  res.once('close', leave);
  return {
    gone: () => gone || req.socket.destroyed,
    signal: controller.signal,
    release: () => {
      res.off('close', leave);
      return Buffer.alloc(0);
    },
  };
}

/** What admission decided: the flow, and either the pinned target, a refusal, or a client that left. */
interface Admission {
  flow: Flow;
  target: PinnedTarget | null;
  refusal: GatewayRefusal | null;
  /** The client left during admission: nothing is answered nor opened; the flow is recorded as such. */
  left: boolean;
  /** The identity its credential proved (null when refused before that), and the credential's lifetime. */
  credential: AgentIdentity | null;
  lifetime: CredentialLifetime | null;
  /** The snapshot the attempt was admitted under. */
  snapshot: Snapshot | null;
}

export class Gateway {
  readonly #d: GatewayDeps;
  #draining = false;
  /** Past the drain's wait: what is still open is being cut, and nothing more is served. */
  #cutting = false;
  /** Flows let through and not yet recorded (tunnels, absolute-form requests in flight). */
  readonly #open = new Map<Flow, OpenFlow>();
  /** Attempts being admitted, with the controller that stops their lookup at shutdown. */
  readonly #admitting = new Map<Promise<void>, AbortController>();
  /** Each open flow's credential lifetime, in one timer: a flow is cut when its credential ends. */
  readonly #lifetimes = new DeadlineQueue<OpenFlow>((due) => this.#expired(due));
  /** The agents a reload removed from the snapshot: refused, and their open flows cut. */
  readonly #removed: RemovedAgents;
  #idle: (() => void) | null = null;

  constructor(deps: GatewayDeps) {
    this.#d = deps;
    this.#removed = new RemovedAgents(deps.snapshot());
  }

  /** Flows open now (tunnels, absolute-form requests in flight). */
  get openFlows(): number {
    return this.#open.size;
  }

  /**
   * Resolves once the tunnels and exchanges in flight have finished, or after `graceMs`, when what is
   * still open is cut (both sides of every tunnel) and its records are waited for (at most
   * RECORD_WAIT_MS): the audit sink is flushed after this, with every record in it. Meanwhile a new
   * CONNECT is refused (503: a tunnel opened now would be cut mid-use when the grace ends), and an
   * absolute-form request that arrives on a connection already open is served with `connection:
   * close`, so its client opens its next connection elsewhere (another worker during a rolling restart,
   * cli/serve-workers.ts) instead of being refused. Past the wait, every attempt is refused.
   */
  async drain(graceMs: number): Promise<void> {
    this.#draining = true;
    if (this.#open.size > 0 || this.#admitting.size > 0) {
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([
        new Promise<void>((resolve) => (this.#idle = resolve)),
        new Promise<void>((resolve) => {
          timer = setTimeout(resolve, graceMs);
        }),
      ]);
      clearTimeout(timer);
    }
    this.#cutting = true;
    this.#idle = null;
    const deadline = new Promise<void>((resolve) => setTimeout(resolve, RECORD_WAIT_MS).unref());
    // Attempts still being admitted stop their lookup; each refuses itself (shutting down) and is recorded.
    for (const controller of this.#admitting.values()) controller.abort(new Error(SHUTDOWN_CUT));
    await Promise.race([Promise.allSettled([...this.#admitting.keys()]), deadline]);
    const pending: Promise<void>[] = [];
    for (const open of [...this.#open.values()]) {
      pending.push(open.flow.written);
      for (const inner of open.cut(SHUTDOWN_CUT, ANSWERS.shuttingDown)) pending.push(inner.written);
    }
    if (pending.length > 0) {
      this.#d.log.info({ flows: pending.length }, 'shutdown grace over: open flows cut');
      await Promise.race([Promise.all(pending), deadline]);
    }
  }

  #settled(): void {
    if (this.#open.size === 0 && this.#admitting.size === 0) this.#idle?.();
  }

  /**
   * Every open flow checked again against the snapshot now current (the gateway calls this on each
   * reload): the agent's standing (an agent the previous snapshot listed and this one does not was
   * removed: refused), then the destination policy for the address the flow was pinned to (a routed
   * host by its name). A flow now refused is cut, its record `deny` with `policy changed: <why>`.
   */
  readonly recheck = (): void => {
    const removed = this.#removed.observe(this.#d.snapshot());
    if (removed.length > 0)
      this.#d.log.info(
        { agents: removed.slice(0, 20), count: removed.length },
        'agents removed from the policy snapshot: refused from now on',
      );
    // One agent's gates are computed once per reload, however many flows it holds open.
    const gates = new Map<string, DestinationGates>();
    for (const open of [...this.#open.values()]) {
      if (open.flow.recorded) continue;
      const refusal = this.#refusedNow(open.credential, open.target, gates);
      if (refusal === null) continue;
      const reason = `policy changed: ${refusal.reason}`;
      this.#d.log.warn(
        { flow_id: open.flow.id, agent_id: open.credential.agentId, dst: open.flow.dst, reason },
        'open flow cut: the policy snapshot now refuses it',
      );
      open.cut(reason, refusal.answer);
    }
  };

  /**
   * Open flows whose credential has ended (the DeadlineQueue's call): each is cut, its record `deny`
   * with `credential expired: <which, when>`, as an attempt with that credential would now be refused.
   */
  #expired(due: OpenFlow[]): void {
    for (const open of due) {
      if (open.flow.recorded) continue;
      const reason = `credential expired: ${open.lifetime.expired}`;
      if (open.retire !== undefined) {
        this.#d.log.info(
          { flow_id: open.flow.id, agent_id: open.credential.agentId, dst: open.flow.dst, reason },
          'intercepted tunnel retired: the credential that admitted it expired; it takes no new request',
        );
        open.retire(reason);
        continue;
      }
      this.#d.log.warn(
        { flow_id: open.flow.id, agent_id: open.credential.agentId, dst: open.flow.dst, reason },
        'open flow cut: the credential that admitted it expired',
      );
      open.cut(reason, ANSWERS.proxyAuthRequired, { 'proxy-authenticate': PROXY_AUTHENTICATE });
    }
  }

  /** The removed agents as of the snapshot now current (a reload not yet re-checked is learnt now). */
  #removedNow(): RemovedAgents {
    this.#removed.observe(this.#d.snapshot());
    return this.#removed;
  }

  /** Whether the current snapshot refuses an admitted flow: its agent's standing, then its destination. */
  #refusedNow(
    credential: AgentIdentity,
    target: PinnedTarget,
    cache: Map<string, DestinationGates> = new Map(),
  ): GatewayRefusal | null {
    const d = this.#d;
    const snapshot = d.snapshot();
    const standing = agentStanding(snapshot, credential, this.#removedNow());
    if (standing.refused) return new GatewayRefusal(ANSWERS.agentRefused, standing.reason);
    const id = standing.identity;
    const key = JSON.stringify([id.orgId, id.groupId, id.agentId]);
    let gates = cache.get(key);
    if (gates === undefined) {
      gates = destinationGates(governanceOf(snapshot, id.orgId, id.groupId, id.agentId), d.cliRules);
      cache.set(key, gates);
    }
    const verdict =
      target.address === ''
        ? decideRouted(gates, target)
        : decideResolved(gates, target, [{ address: target.address, family: target.family }]);
    return verdict.allowed ? null : new GatewayRefusal(destinationRefused(verdict.reason), verdict.reason);
  }

  /** Registers an open flow until its record is written; it is cut when its credential ends. */
  #hold(open: OpenFlow): void {
    this.#open.set(open.flow, open);
    const deadline: Deadline<OpenFlow> = this.#lifetimes.add(open.lifetime.endsAt, open);
    open.flow.written.then(() => {
      this.#lifetimes.remove(deadline);
      this.#open.delete(open.flow);
      this.#settled();
    });
  }

  /** Tracks an attempt while it is admitted (and until it is answered or opened). */
  #track(run: (abort: AbortSignal) => Promise<void>): Promise<void> {
    const controller = new AbortController();
    const p = run(controller.signal).finally(() => {
      this.#admitting.delete(p);
      this.#settled();
    });
    this.#admitting.set(p, controller);
    return p;
  }

  /** node's 'connect' event: `CONNECT host:port`. The socket is ours from here; its errors too. */
  readonly connect = (req: IncomingMessage, socket: Duplex, head: Buffer): void => {
    socket.on('error', (err: Error) => this.#d.log.debug({ err }, 'agent connection error'));
    if (this.#draining) {
      answerSocket(socket, ANSWERS.shuttingDown, null);
      return;
    }
    this.#track((stop) => this.#connect(req, socket, head, stop)).catch((err: Error) => {
      // Nothing should reach here (#connect answers its own failures); a client is never left hanging.
      this.#d.log.error({ err }, 'CONNECT failed');
      answerSocket(socket, ANSWERS.upstreamFailed, null);
    });
  };

  /** node's 'request' event: an absolute-form `http://` request, or `/healthz`. */
  readonly request = (req: IncomingMessage, res: ServerResponse): void => {
    const url = req.url ?? '';
    if (url.startsWith('/')) {
      const path = url.split('?')[0];
      if (path === HEALTH_PATH && (req.method === 'GET' || req.method === 'HEAD')) {
        res.writeHead(200, { 'content-type': 'application/json' });
        const status = this.#draining ? 'draining' : 'ok';
        res.end(JSON.stringify({ component: 'gateway', status, version: this.#d.version }));
        return;
      }
      writeAnswer(
        req,
        res,
        badProxyRequest(
          'this is a forward proxy: send absolute-form requests (http://host/path) or CONNECT host:port, with the gateway as your proxy',
        ),
        null,
      );
      return;
    }
    if (this.#cutting) {
      writeAnswer(req, res, ANSWERS.shuttingDown, null);
      return;
    }
    if (this.#draining) res.shouldKeepAlive = false;
    // Admitted (token, destination lookup) only when its turn comes: requests pipelined behind one in
    // flight wait unread, a flood of them closes the connection (pipelining.ts).
    inTurn(
      req,
      res,
      () =>
        this.#track((stop) => this.#request(req, res, stop)).catch((err: Error) => {
          this.#d.log.error({ err }, 'proxy request failed');
          if (!res.headersSent && !res.destroyed) writeAnswer(req, res, ANSWERS.upstreamFailed, null);
          else res.destroy();
        }),
      (why) => this.#d.log.info({ src: req.socket.remoteAddress }, `pipelined request dropped: ${why}`),
    );
  };

  async #connect(req: IncomingMessage, socket: Duplex, head: Buffer, stop: AbortSignal): Promise<void> {
    const d = this.#d;
    const watch = watchConnectClient(socket, head);
    let admission: Admission;
    try {
      admission = await this.#admit(req, socket as TLSSocket, 'tcp', () => connectTarget(req.url ?? ''), watch, stop);
    } finally {
      head = watch.release();
    }
    const { flow, target, refusal, credential, lifetime, snapshot } = admission;
    if (admission.left || (refusal === null && watch.gone())) {
      this.#left(flow);
      socket.destroy();
      return;
    }
    // A shutdown that began while the attempt was being admitted refuses it: nothing opens past the
    // drain. A reload that landed meanwhile, or the credential's end, is applied before anything opens.
    const refused =
      refusal ??
      (this.#draining ? new GatewayRefusal(ANSWERS.shuttingDown, SHUTDOWN_CUT) : null) ??
      endedMeanwhile(lifetime!) ??
      (d.snapshot() !== snapshot ? this.#refusedNow(credential!, target!) : null);
    if (refused) {
      this.#refuse(flow, refused);
      answerSocket(socket, refused.answer, refused.headers);
      return;
    }
    const pinned = target!;
    try {
      if (d.interceptor?.wants(pinned)) this.#intercept(socket, head, pinned, flow, credential!, lifetime!);
      else {
        const tunnel = openTunnel(d, socket as TLSSocket, head, pinned, flow);
        this.#hold({
          flow,
          credential: credential!,
          lifetime: lifetime!,
          target: pinned,
          cut: (reason, answer, headers) => tunnel.cut(reason, answer, headers),
        });
      }
    } catch (err) {
      this.#failed(flow, err);
      if (!flow.recorded) recordFlow(d, flow);
      answerSocket(socket, ANSWERS.upstreamFailed, null);
    }
  }

  /** An allowed CONNECT whose TLS the gateway terminates (intercept.ts). */
  #intercept(
    socket: Duplex,
    head: Buffer,
    pinned: PinnedTarget,
    flow: Flow,
    credential: AgentIdentity,
    lifetime: CredentialLifetime,
  ): void {
    const d = this.#d;
    const interceptor = d.interceptor!;
    flow.dstIp = pinned.address;
    flow.attrs.status = '200';
    d.metrics.tunnelsOpen.inc({ kind: 'intercepted' });
    socket.once('close', () => d.metrics.tunnelsOpen.dec({ kind: 'intercepted' }));
    this.#hold({
      flow,
      credential,
      lifetime,
      target: pinned,
      cut: (reason) => {
        if (!flow.recorded) flow.cutReason ??= reason;
        const inner = interceptor.cut(socket, reason);
        socket.destroy();
        return inner;
      },
      retire: (reason) => {
        // The tunnel ends because its credential did, not because it was refused: its record says so
        // with its own outcome; only requests still in flight past the grace are cut.
        if (!flow.recorded) flow.reason = `${reason}: tunnel closed`;
        const grace = d.retireGraceMs ?? RETIRE_GRACE_MS;
        const overdue = () => {
          const why = `${reason}: still in flight ${grace / 1000} s later`;
          if (!flow.recorded) flow.cutReason ??= why;
          interceptor.cut(socket, why);
          socket.destroy();
        };
        if (interceptor.retire(socket, grace, overdue)) socket.destroy();
      },
    });
    socket.write('HTTP/1.1 200 Connection Established\r\n\r\n');
    // The tunnel is recorded once the interceptor is done with it (its socket closed, every request
    // inside answered): its bytes and attrs are final then.
    const failed = (err: unknown) => {
      d.log.error({ err, flow_id: flow.id }, 'interception failed');
      flow.reason = `interception failed: ${(err as Error).message}`;
      socket.destroy();
    };
    try {
      interceptor.serve(socket, head, pinned, flow).then(
        () => recordFlow(d, flow),
        (err: unknown) => {
          failed(err);
          recordFlow(d, flow);
        },
      );
    } catch (err) {
      failed(err);
      recordFlow(d, flow);
    }
  }

  async #request(req: IncomingMessage, res: ServerResponse, stop: AbortSignal): Promise<void> {
    const d = this.#d;
    const watch = watchRequestClient(req, res);
    let admission: Admission;
    try {
      admission = await this.#admit(
        req,
        req.socket as TLSSocket,
        'http',
        () => {
          const t = absoluteTarget(req.url ?? '');
          const hostProblem = hostHeaderProblem(req.rawHeaders, t, 80);
          if (hostProblem) throw new GatewayRefusal(badProxyRequest(hostProblem), hostProblem);
          return t;
        },
        watch,
        stop,
      );
    } finally {
      watch.release();
    }
    const { flow, target, refusal, credential, lifetime, snapshot } = admission;
    flow.attrs.method = req.method ?? '';
    flow.attrs.url = printable(req.url ?? '');
    if (admission.left || (refusal === null && watch.gone())) {
      this.#left(flow);
      res.destroy();
      return;
    }
    const refused =
      refusal ??
      (this.#cutting ? new GatewayRefusal(ANSWERS.shuttingDown, SHUTDOWN_CUT) : null) ??
      endedMeanwhile(lifetime!) ??
      (d.snapshot() !== snapshot ? this.#refusedNow(credential!, target!) : null);
    if (refused) {
      this.#refuse(flow, refused);
      writeAnswer(req, res, refused.answer, refused.headers);
      return;
    }
    delete flow.attrs.method;
    delete flow.attrs.url;
    // The gateway's credential stops here; the agent's own headers go on.
    delete req.headers['proxy-authorization'];
    for (let i = req.rawHeaders.length - 2; i >= 0; i -= 2)
      if (req.rawHeaders[i].toLowerCase() === 'proxy-authorization') req.rawHeaders.splice(i, 2);
    this.#hold({
      flow,
      credential: credential!,
      lifetime: lifetime!,
      target: target!,
      cut: (reason) => {
        if (!flow.recorded) flow.cutReason ??= reason;
        res.destroy();
        return [];
      },
    });
    d.exchange(req, res, target!, 'http', flow);
  }

  /**
   * Identity, standing, target and destination of one attempt. Returns the flow (for the record) and
   * either the pinned target, the refusal to answer, or that the client left meanwhile (checked after
   * every wait). A failure of the gateway's own once the flow exists is a 502 refusal, recorded; one
   * before (the identity check failing unexpectedly) is thrown, for the door to answer 502.
   */
  async #admit(
    req: IncomingMessage,
    socket: TLSSocket,
    proto: FlowProto,
    parse: () => Target,
    watch: ClientWatch,
    stop: AbortSignal,
  ): Promise<Admission> {
    const d = this.#d;
    const who = await this.#identify(req, socket);
    let target: Target | null = null;
    let badTarget: GatewayRefusal | null = null;
    try {
      target = parse();
    } catch (err) {
      if (!(err instanceof GatewayRefusal)) throw err;
      badTarget = err;
    }
    const flow = new Flow(proto, clientAddress(socket), target ?? { host: '', port: 0 });
    if (target === null) flow.dst = printable(req.url ?? '');
    flow.identity = who.identity;
    const credential = who.error ? null : who.identity;
    const lifetime = who.lifetime;
    const refused = (refusal: GatewayRefusal): Admission => ({
      flow,
      target: null,
      refusal,
      left: false,
      credential,
      lifetime,
      snapshot: null,
    });
    const left = (): Admission => ({
      flow,
      target: null,
      refusal: null,
      left: true,
      credential,
      lifetime,
      snapshot: null,
    });
    try {
      if (who.error) {
        d.metrics.authFailures.inc({ reason: who.error.reason });
        d.log.warn(
          {
            err: who.error,
            reason: who.error.reason,
            flow_id: flow.id,
            src: flow.src,
            agent_id: who.identity?.agentId,
            org_id: who.identity?.orgId,
          },
          'agent authentication failed',
        );
        return refused(
          new GatewayRefusal(ANSWERS.proxyAuthRequired, `agent authentication failed: ${who.error.message}`, {
            'proxy-authenticate': PROXY_AUTHENTICATE,
          }),
        );
      }
      // The identity check may have waited (a JWKS fetch): a client gone meanwhile is not served.
      if (watch.gone()) return left();
      // The snapshot current once the caller is known: a suspension that landed meanwhile applies.
      const snapshot = d.snapshot();
      const standing = agentStanding(snapshot, who.identity, this.#removedNow());
      flow.identity = standing.identity;
      if (standing.refused) {
        d.log.warn(
          {
            flow_id: flow.id,
            agent_id: who.identity.agentId,
            token_org: who.identity.orgId,
            status: standing.status,
            contained: standing.contained,
          },
          standing.why === 'org'
            ? 'agent org does not match the snapshot'
            : standing.why === 'removed'
              ? 'agent removed from the snapshot'
              : 'agent refused by its state',
        );
        return refused(new GatewayRefusal(ANSWERS.agentRefused, standing.reason));
      }
      if (badTarget || target === null) return refused(badTarget!);
      if (proto === 'tcp') {
        const hostProblem = hostHeaderProblem(req.rawHeaders, target, null);
        if (hostProblem) return refused(new GatewayRefusal(badProxyRequest(hostProblem), hostProblem));
      }
      const identity = standing.identity;
      const gates = destinationGates(
        governanceOf(snapshot, identity.orgId, identity.groupId, identity.agentId),
        d.cliRules,
      );
      const toLlmproxy = d.llmproxy?.matches(target.host) ?? false;
      const toControlPlane = d.operatorTokens?.matches(target.host, target.port) ?? false;
      // A tunnel to a host the gateway must govern inside (a route, a credential) is refused unless its
      // TLS is terminated: a blind tunnel would carry the agent past the route or without the credential.
      if (proto === 'tcp') {
        const must = toLlmproxy
          ? 'its requests are routed to llmproxy'
          : toControlPlane
            ? 'its requests carry an agent-operator token'
            : rulesFor(d.injectRules, target.host, target.port).length > 0
              ? 'a --inject-cred rule applies to it'
              : null;
        if (must !== null && !d.interceptor?.wants(target)) {
          const reason =
            refuseByName(gates, target) ??
            `a tunnel to ${flow.dst} must be intercepted (${must}) and the gateway has no interception CA (--ca-cert)`;
          return refused(new GatewayRefusal(destinationRefused(reason), reason));
        }
      }
      let pinned: PinnedTarget;
      try {
        pinned =
          toLlmproxy || toControlPlane
            ? admitRouted(gates, target)
            : await admitDestination(gates, target, d.lookup, {
                agent: identity.agentId,
                timeoutMs: d.options.connectTimeout,
                signal: AbortSignal.any([watch.signal, stop]),
              });
      } catch (err) {
        if (watch.gone()) return left();
        if (!(err instanceof GatewayRefusal)) throw err;
        return refused(err);
      }
      if (watch.gone()) return left();
      flow.dstIp = pinned.address;
      return { flow, target: pinned, refusal: null, left: false, credential, lifetime, snapshot };
    } catch (err) {
      // A failure of the gateway's own: the client gets a 502 and the flow its record, never silence.
      d.log.error({ err, flow_id: flow.id }, 'attempt admission failed');
      return refused(new GatewayRefusal(ANSWERS.upstreamFailed, `gateway error: ${(err as Error).message}`));
    }
  }

  /** Proxy-Authorization: Bearer <platform JWT> when present (never rescued by a certificate), else the mTLS certificate. */
  async #identify(req: IncomingMessage, socket: TLSSocket): Promise<Identified> {
    const raw = req.headers['proxy-authorization'];
    try {
      if (raw !== undefined) {
        const m = BEARER.exec(raw);
        if (!m) throw new AuthError('malformed', 'Proxy-Authorization must be "Bearer <platform JWT>"');
        const identity = await this.#d.auth.verifyToken(m[1], null);
        return { identity, lifetime: tokenLifetime(m[1]), error: null };
      }
      // The certificate's validity is checked now, for this attempt, not only at the handshake: a
      // kept-alive connection outlives it (certificateIdentity refuses one expired since).
      const fromCert = certificateIdentity(socket);
      if (fromCert) return { identity: fromCert, lifetime: certificateLifetime(socket), error: null };
      throw new AuthError(
        'agent',
        'missing agent credential (Proxy-Authorization: Bearer, or an identity certificate)',
      );
    } catch (err) {
      if (!(err instanceof AuthError)) throw err;
      return { identity: err.identity, lifetime: null, error: err };
    }
  }

  /** A refused attempt: its record (when the caller is known) and its metric; the door writes the answer. */
  #refuse(flow: Flow, refusal: GatewayRefusal): void {
    flow.outcome = 'deny';
    flow.reason = refusal.reason;
    flow.attrs.status = String(refusal.answer.status);
    this.#d.metrics.refusals.inc({ status: String(refusal.answer.status) });
    if (refusal.answer.status !== 407)
      this.#d.log.info(
        { flow_id: flow.id, agent_id: flow.identity?.agentId, dst: flow.dst, status: refusal.answer.status },
        `attempt refused: ${refusal.reason}`,
      );
    recordFlow(this.#d, flow);
  }

  /** An attempt whose client left while it was admitted: nothing was opened, nothing is answered; recorded. */
  #left(flow: Flow): void {
    flow.outcome = 'deny';
    flow.reason = CLIENT_GONE;
    this.#d.log.info(
      { flow_id: flow.id, agent_id: flow.identity?.agentId, dst: flow.dst },
      'attempt abandoned: client went away',
    );
    recordFlow(this.#d, flow);
  }

  /** A failure of the gateway's own after admission: the flow's reason. */
  #failed(flow: Flow, err: unknown): void {
    this.#d.log.error({ err, flow_id: flow.id }, 'opening the flow failed');
    flow.outcome = 'deny';
    flow.reason = `gateway error: ${(err as Error).message}`;
    flow.attrs.status = '502';
  }
}

/**
 * A verified token's lifetime: refused from exp + the clock tolerance on (auth.ts), so an attempt
 * admitted within the tolerance is not cut the moment it opens. Its exp was verified: it is a number.
 */
function tokenLifetime(token: string): CredentialLifetime {
  const exp = Number(decodeJwt(token).exp);
  return {
    endsAt: (exp + CLOCK_TOLERANCE_S) * 1000,
    expired: `token expired at ${new Date(exp * 1000).toISOString()}`,
  };
}

/** A verified identity certificate's lifetime: refused once past its notAfter (certificateIdentity). */
function certificateLifetime(socket: TLSSocket): CredentialLifetime {
  const notAfter = Date.parse(socket.getPeerX509Certificate()?.validTo ?? '');
  return {
    endsAt: notAfter + 1,
    expired: `identity certificate expired at ${Number.isNaN(notAfter) ? 'an unreadable time' : new Date(notAfter).toISOString()}`,
  };
}

/** The refusal of an attempt whose credential ended while it was admitted (a slow lookup): nothing opens. */
function endedMeanwhile(lifetime: CredentialLifetime): GatewayRefusal | null {
  if (Date.now() < lifetime.endsAt) return null;
  return new GatewayRefusal(ANSWERS.proxyAuthRequired, `agent authentication failed: ${lifetime.expired}`, {
    'proxy-authenticate': PROXY_AUTHENTICATE,
  });
}

/** One of the gateway's own answers to an absolute-form request (the connection closed after it when a body would follow). */
function writeAnswer(
  req: IncomingMessage,
  res: ServerResponse,
  answer: GatewayAnswer,
  headers: Record<string, string> | null,
): void {
  req.resume();
  // A body the gateway will not forward is not read to its end on a kept-alive connection.
  const hasBody = req.headers['transfer-encoding'] !== undefined || Number(req.headers['content-length'] ?? 0) > 0;
  const close = answer.status === 400 || answer.status === 503 || hasBody;
  res.writeHead(answer.status, STATUS_CODES[answer.status], {
    'content-type': answer.contentType,
    'content-length': answer.body.length,
    ...(close ? { connection: 'close' } : {}),
    ...headers,
  });
  res.end(answer.body);
}
