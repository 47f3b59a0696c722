import t from 'tap';
import { conversationParts } from '../../pipeline/conversation-parts.ts';
import { ResentParts } from '../../pipeline/resent-parts.ts';

// Attack on the remembered bodies' cap (resent-parts.ts): a remembered body shares its leading parts'
// bytes with the body before it, and is counted for its own length. Sharing a small head of a large
// piece kept the whole piece alive: an agent alternating a short turn with a long one (a 1 MB last
// message, then a turn without it) had each short body hold the long one's memory, and the chain of
// shares (up to 32 pieces a body) held many of them, far past the cap that was counted.

const CAP = 8 * 1024 * 1024;
const msg = (i: number) => ({ role: 'user', content: `message ${i} ${'lorem ipsum '.repeat(30)}` });
const big = (i: number) => ({ role: 'user', content: `${i} ${'x'.repeat(1024 * 1024)}` });

t.test('short and long turns in turn: what is held stays within twice what is counted', async (t) => {
  const resent = new ResentParts(CAP);
  const messages: unknown[] = [];
  let worst = 0;
  for (let turn = 0; turn < 40; turn++) {
    messages.push(msg(turn));
    // Every other turn ends with a large message, the next one drops it.
    const sent = turn % 2 === 0 ? [...messages, big(turn)] : messages;
    const body = Buffer.from(JSON.stringify({ model: 'm', messages: sent }));
    const recall = resent.recall('agent', body);
    const parts = conversationParts(body, 256, recall?.known);
    t.ok(parts, 'the body has parts');
    resent.hashes('agent', body, parts!, recall);
    worst = Math.max(worst, resent.retainedBytes / resent.bytes);
  }
  t.ok(resent.bytes <= CAP, 'the counted bytes are within the cap');
  t.ok(worst <= 2, `memory held is at most twice what is counted (worst ${worst.toFixed(1)}×)`);
});
