import { createHash } from 'node:crypto';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { request } from 'undici';
import { SseParser, type SseEvent } from '../../../core/sse.ts';
import type { BrokerHarness } from '../../fixtures/broker-harness.ts';

// What the approvals tests share: an approval request as llmproxy sends it, the satellite token, and a
// real SSE client of the operator feed.

export const sha256 = (s: string): string => createHash('sha256').update(s).digest('hex');

let n = 0;
/** A valid approvalRequest for `agent` of `org` (a fresh request_id each), with `over` on top. */
export function approvalRequest(org: string, agent: string, over: Record<string, unknown> = {}) {
  const args = JSON.stringify({ amount: 500, to: 'acct-9' });
  return {
    request_id: `req-${++n}-${Date.now().toString(36)}`,
    call_id: 'toolu_01',
    org_id: org,
    agent_id: agent,
    agent_name: 'ignored: the broker names its agents',
    model: 'claude-sonnet-4-5',
    tool: 'transfer_funds',
    arguments: args,
    args_digest: sha256(args),
    rule: 'payments.rules[0]',
    summary: 'transfers above 100 need a person',
    policy_version: '0123456789abcdef',
    expires_in_ms: 60_000,
    ...over,
  };
}

export async function satelliteTokenOf(h: BrokerHarness): Promise<string> {
  return (await readFile(join(h.dir, 'state', 'satellite-token'), 'utf8')).trim();
}

/** An open operator feed: the events so far, and its end. */
export async function openFeed(h: BrokerHarness, who: string, headers: Record<string, string> = {}) {
  const controller = new AbortController();
  const res = await request(`https://127.0.0.1:${h.broker.operatorPort}/api/v1/approvals/stream`, {
    dispatcher: h.dispatcher,
    signal: controller.signal,
    headers: { authorization: `Bearer ${await h.issuer!.token(who)}`, ...headers },
  });
  const parser = new SseParser();
  const events: SseEvent[] = [];
  let raw = '';
  let ended = false;
  const done = (async () => {
    try {
      for await (const chunk of res.body) {
        raw += (chunk as Buffer).toString();
        events.push(...parser.push(chunk as Buffer));
      }
      events.push(...parser.end());
    } catch {
      // aborted by the test
    }
    ended = true;
  })();
  return {
    status: res.statusCode,
    type: res.headers['content-type'],
    events,
    raw: () => raw,
    ended: () => ended,
    /** The approvalViews received, each with its event's id as `seq`. */
    approvals: () => events.filter((e) => e.event === 'approval').map((e) => ({ ...JSON.parse(e.data), seq: e.id })),
    async close() {
      controller.abort();
      await done;
    },
  };
}
