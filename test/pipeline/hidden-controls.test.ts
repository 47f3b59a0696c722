import fc from 'fast-check';
import t from 'tap';
import {
  HIDDEN_CONTROL,
  hiddenControlScan,
  holdsHiddenControl,
  holdsHiddenControlScalar,
} from '../../pipeline/hidden-controls.ts';

// The definition: a C0 control or DEL that is not white space (Unicode's White_Space holds 0009–000D).
const hidden = (b: number) => (b <= 0x1f || b === 0x7f) && !/\s/u.test(String.fromCharCode(b));

t.test('the table is the C0 controls and DEL that are not white space', async (t) => {
  for (let b = 0; b < 256; b++) t.equal(HIDDEN_CONTROL[b] === 1, hidden(b), `0x${b.toString(16)}`);
});

t.test('this process scans with WebAssembly SIMD', async (t) => {
  t.equal(hiddenControlScan, 'simd', 'Node 24 has it; the scalar scan is the fallback');
});

t.test('every byte value at every place of short inputs, at every alignment, both scans', async (t) => {
  let checked = 0;
  const backing = Buffer.alloc(96);
  for (let length = 1; length <= 40; length++) {
    for (let shift = 0; shift < 4; shift++) {
      for (let at = 0; at < length; at++) {
        for (let b = 0; b < 256; b++) {
          backing.fill(0x61);
          const bytes = backing.subarray(shift, shift + length);
          bytes[at] = b;
          if (holdsHiddenControl(bytes) !== hidden(b) || holdsHiddenControlScalar(bytes) !== hidden(b))
            t.fail(`length ${length}, shift ${shift}, byte 0x${b.toString(16)} at ${at}`);
          checked++;
        }
      }
    }
  }
  t.equal(checked, 4 * 256 * ((40 * 41) / 2), 'all cases ran');
  t.notOk(holdsHiddenControl(Buffer.alloc(0)), 'empty');
});

t.test('a control in any chunk of a large input, at the seams and the end', async (t) => {
  // The SIMD scan copies 64 KB at a time into its memory, the last chunk padded to 16 bytes.
  const size = 3 * 65536 + 7;
  const body = Buffer.alloc(size, 'line of text\twith tabs\r\n');
  t.notOk(holdsHiddenControl(body), 'white space only');
  t.notOk(holdsHiddenControlScalar(body));
  for (const at of [0, 65535, 65536, 65537, 131071, 2 * 65536, size - 8, size - 1]) {
    const copy = Buffer.from(body);
    copy[at] = 0x00;
    t.ok(holdsHiddenControl(copy), `NUL at ${at}`);
    copy[at] = 0x7f;
    t.ok(holdsHiddenControl(copy), `DEL at ${at}`);
    t.ok(holdsHiddenControlScalar(copy), `DEL at ${at}, scalar`);
  }
  // A chunk that held a control does not leave it behind for the next input.
  const after = Buffer.alloc(100, 'a');
  t.notOk(holdsHiddenControl(after), 'the memory of the last scan is not read again');
});

t.test('property: both scans agree with the definition', async (_t) => {
  const byte = fc.oneof(fc.integer({ min: 0, max: 255 }), fc.constantFrom(0x20, 0x61, 0x0a, 0x09, 0x80, 0xff));
  fc.assert(
    fc.property(fc.array(byte, { maxLength: 300 }), fc.nat({ max: 7 }), (values, shift) => {
      const buffer = Buffer.alloc(values.length + 8);
      Buffer.from(values).copy(buffer, shift);
      const bytes = buffer.subarray(shift, shift + values.length);
      const expected = values.some(hidden);
      return holdsHiddenControl(bytes) === expected && holdsHiddenControlScalar(bytes) === expected;
    }),
    { numRuns: 5000 },
  );
});
