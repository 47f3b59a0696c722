import v8 from 'node:v8';
import vm from 'node:vm';
import t from 'tap';
import { compilePlan } from '../../pipeline/plan.ts';
import { policyFromDocument } from '../../pipeline/policy/resolve.ts';
import { validatePolicyDocument } from '../../pipeline/policy/validate.ts';
import { scanBody } from '../../pipeline/scan.ts';

// Model restriction remembers its verdict per model name (model-restriction.ts). A multipart part's
// name is its decoded text trimmed, which V8 may keep as a slice of the whole text: remembered as it
// is, 256 names padded with whitespace held 256 whole upload bodies after their calls were refused
// (the attacker's review of "A small scan's fixed cost", docs/decisions.md). The memo keeps copies.

v8.setFlagsFromString('--expose-gc');
const gc = vm.runInNewContext('gc') as () => void;

const plan = compilePlan(
  policyFromDocument(validatePolicyDocument({ model_policy: { mode: 'allowlist', models: ['claude-*'] } })),
);
const retained = () => {
  gc();
  gc();
  const m = process.memoryUsage();
  return m.heapUsed + m.external + m.arrayBuffers;
};

t.test('names padded with whitespace in multipart parts: refused, and their bodies not kept', async (t) => {
  const contentType = 'multipart/form-data; boundary=XyZ';
  const pad = Buffer.alloc(2 * 1024 * 1024, 0x20);
  const before = retained();
  for (let i = 0; i < 40; i++) {
    const body = Buffer.concat([
      Buffer.from(`--XyZ\r\nContent-Disposition: form-data; name="model"\r\n\r\nsome-model-name-${i}`),
      pad,
      Buffer.from('\r\n--XyZ--\r\n'),
    ]);
    const out = scanBody(plan, {
      body,
      phase: 'request',
      secrets: [],
      modelsAnywhere: { contentType },
      modelOnly: true,
    });
    if (!t.equal(out.findings[0]?.inspector_type, 'model_restriction', `name ${i} refused`)) return;
  }
  const kept = retained() - before;
  // 40 bodies of 2 MB: kept whole they are 80 MB and more.
  t.ok(kept < 16 * 1024 * 1024, `${Math.round(kept / 1024)} KiB kept after 40 refused calls of 2 MiB`);
});
