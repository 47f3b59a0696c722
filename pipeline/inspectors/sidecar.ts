import { Agent, request } from 'undici';
import { SidecarError } from '../errors.ts';
import { MAX_FINDINGS_PER_INSPECTOR, redact, type Finding, type Phase } from '../finding.ts';
import { recordedSeverity } from '../policy/severity.ts';
import type { Sidecar } from '../policy/types.ts';

// sidecar: the one asynchronous inspector (spec: "Sidecar protocol"). POSTs
//   {agent_id, organization_id, agent_name, phase, body, context?}
// and reads {findings: [{description, match, severity}]}. The sidecar's configured severity is applied
// to every finding it returns. Any failure (network, timeout, non-200, bad JSON, a body over 1 MB) is
// thrown as a SidecarError; the engine turns it into a recorded fail-open with no findings.
// Not in the inspector registry (inspectors/registry.ts): a sidecar is an asynchronous network call,
// one per configured sidecar rather than compiled from the policy, that always fails open and has a
// timeout of its own; the engine runs it beside the built-ins (docs/decisions.md, "The inspector
// contract").

export const MAX_SIDECAR_RESPONSE_BYTES = 1024 * 1024;

export interface SidecarIdentity {
  agentId: string | number;
  orgId: string | number;
  agentName: string;
}

export interface SidecarCall {
  sidecar: Sidecar;
  phase: Phase;
  body: Buffer;
  identity: SidecarIdentity;
  /** The LLM request body, whose `messages` become `context.recent_messages` with include_context. */
  requestBody?: Buffer;
  signal?: AbortSignal;
}

// Sidecars are long-lived local services: one keep-alive pool for all of them.
let dispatcher: Agent | null = null;
function sidecarDispatcher(): Agent {
  dispatcher ??= new Agent({ keepAliveTimeout: 10_000, connections: 64 });
  return dispatcher;
}

export async function closeSidecarDispatcher(): Promise<void> {
  const d = dispatcher;
  dispatcher = null;
  await d?.close();
}

/** The spec types the ids as integers; ours may be opaque strings, sent as numbers when they are digits. */
function wireId(id: string | number): string | number {
  return typeof id === 'string' && /^\d{1,15}$/.test(id) ? Number(id) : id;
}

export function recentMessages(requestBody: Buffer | undefined): { role: unknown; content: unknown }[] {
  if (!requestBody) return [];
  try {
    const parsed = JSON.parse(requestBody.toString('utf8')) as { messages?: unknown };
    if (!Array.isArray(parsed.messages)) return [];
    return parsed.messages
      .filter((m): m is Record<string, unknown> => m !== null && typeof m === 'object')
      .map((m) => ({ role: m.role, content: m.content }));
  } catch {
    return []; // context is optional (spec: "Sidecar protocol"): a body that does not parse sends none
  }
}

export function sidecarPayload(call: SidecarCall): string {
  const payload: Record<string, unknown> = {
    agent_id: wireId(call.identity.agentId),
    organization_id: wireId(call.identity.orgId),
    agent_name: call.identity.agentName,
    phase: call.phase,
    body: call.body.toString('utf8'),
  };
  if (call.sidecar.include_context) {
    payload.context = { recent_messages: recentMessages(call.phase === 'request' ? call.body : call.requestBody) };
  }
  return JSON.stringify(payload);
}

export async function callSidecar(call: SidecarCall): Promise<Finding[]> {
  const { sidecar } = call;
  const timeout = AbortSignal.timeout(sidecar.timeout_ms);
  const signal = call.signal ? AbortSignal.any([call.signal, timeout]) : timeout;
  let raw: Buffer;
  try {
    const res = await request(sidecar.url, {
      method: 'POST',
      headers: { 'content-type': 'application/json', accept: 'application/json' },
      body: sidecarPayload(call),
      signal,
      dispatcher: sidecarDispatcher(),
    });
    if (res.statusCode !== 200) {
      res.body.resume();
      throw new SidecarError('status', `sidecar ${sidecar.name} answered HTTP ${res.statusCode}`);
    }
    const chunks: Buffer[] = [];
    let size = 0;
    for await (const chunk of res.body) {
      size += (chunk as Buffer).length;
      if (size > MAX_SIDECAR_RESPONSE_BYTES) {
        res.body.destroy();
        throw new SidecarError(
          'too_large',
          `sidecar ${sidecar.name} response exceeds ${MAX_SIDECAR_RESPONSE_BYTES} bytes`,
        );
      }
      chunks.push(chunk as Buffer);
    }
    raw = Buffer.concat(chunks, size);
  } catch (err) {
    if (err instanceof SidecarError) throw err;
    if (timeout.aborted)
      throw new SidecarError('timeout', `sidecar ${sidecar.name} timed out after ${sidecar.timeout_ms} ms`);
    if (call.signal?.aborted)
      throw new SidecarError('deadline', `sidecar ${sidecar.name} cut off by the inspection deadline`);
    throw new SidecarError('network', `sidecar ${sidecar.name} unreachable: ${(err as Error).message}`, { cause: err });
  }
  return parseSidecarFindings(sidecar, raw);
}

export function parseSidecarFindings(sidecar: Sidecar, raw: Buffer): Finding[] {
  let parsed: unknown;
  try {
    parsed = JSON.parse(raw.toString('utf8'));
  } catch {
    // No cause: JSON.parse's message quotes the answer, which may carry what the sidecar inspected.
    throw new SidecarError('bad_json', `sidecar ${sidecar.name} returned malformed JSON`);
  }
  const list = (parsed as { findings?: unknown } | null)?.findings;
  if (parsed === null || typeof parsed !== 'object' || !Array.isArray(list)) {
    throw new SidecarError('bad_json', `sidecar ${sidecar.name} returned no findings array`);
  }
  const severity = recordedSeverity(sidecar.severity);
  const findings: Finding[] = [];
  for (const item of list.slice(0, MAX_FINDINGS_PER_INSPECTOR)) {
    if (item === null || typeof item !== 'object')
      throw new SidecarError('bad_json', `sidecar ${sidecar.name} returned a finding that is not an object`);
    const f = item as { description?: unknown; match?: unknown };
    findings.push({
      inspector_type: `sidecar:${sidecar.name}`,
      severity,
      description: typeof f.description === 'string' ? f.description : '',
      match: redact(typeof f.match === 'string' ? f.match : ''),
      location: 'sidecar',
    });
  }
  return findings;
}
