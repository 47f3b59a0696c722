import t from 'tap';
import { matrix } from './tool-approvals-matrix.ts';
import { startE2eBroker, startE2eProxy } from './tool-approvals-fixture.ts';

// The tool-call approval loop end to end, streamed answers (tool-approvals-matrix.ts), through the
// tool gate: llmproxy with its snapshot's tool policy and the production decider, a real broker, a
// person deciding on the broker's operator API, the official SDKs' streaming helpers.

const b = await startE2eBroker();
t.teardown(() => b.close());
const h = await startE2eProxy(b);
t.teardown(() => h.close());

matrix(t, h, b, true, 'agent-2');
