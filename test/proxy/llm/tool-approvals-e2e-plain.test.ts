import t from 'tap';
import { matrix } from './tool-approvals-matrix.ts';
import { startE2eBroker, startE2eProxy } from './tool-approvals-fixture.ts';

// The tool-call approval loop end to end, plain answers (tool-approvals-matrix.ts): llmproxy with its
// snapshot's tool policy and the production decider, a real broker it asks for approvals, a person
// deciding on the broker's operator API, the official SDKs of the three formats.

const b = await startE2eBroker();
t.teardown(() => b.close());
const h = await startE2eProxy(b);
t.teardown(() => h.close());

matrix(t, h, b, false, 'agent-1');
