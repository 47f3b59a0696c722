import t from 'tap';
import { isValidPattern, pathMatch } from '../../pipeline/path-match.ts';

// Go's own table (go/src/path/match_test.go); `bad` rows are ErrBadPattern, which match nothing.
const GO_TABLE: [string, string, boolean, boolean?][] = [
  ['abc', 'abc', true],
  ['*', 'abc', true],
  ['*c', 'abc', true],
  ['a*', 'a', true],
  ['a*', 'abc', true],
  ['a*', 'ab/c', false],
  ['a*/b', 'abc/b', true],
  ['a*/b', 'a/c/b', false],
  ['a*b*c*d*e*/f', 'axbxcxdxe/f', true],
  ['a*b*c*d*e*/f', 'axbxcxdxexxx/f', true],
  ['a*b*c*d*e*/f', 'axbxcxdxe/xxx/f', false],
  ['a*b*c*d*e*/f', 'axbxcxdxexxx/fff', false],
  ['a*b?c*x', 'abxbbxdbxebxczzx', true],
  ['a*b?c*x', 'abxbbxdbxebxczzy', false],
  ['ab[c]', 'abc', true],
  ['ab[b-d]', 'abc', true],
  ['ab[e-g]', 'abc', false],
  ['ab[^c]', 'abc', false],
  ['ab[^b-d]', 'abc', false],
  ['ab[^e-g]', 'abc', true],
  ['a\\*b', 'a*b', true],
  ['a\\*b', 'ab', false],
  ['a?b', 'a☺b', true],
  ['a[^a]b', 'a☺b', true],
  ['a???b', 'a☺b', false],
  ['a[^a][^a][^a]b', 'a☺b', false],
  ['[a-ζ]*', 'α', true],
  ['*[a-ζ]', 'A', false],
  ['a?b', 'a/b', false],
  ['a*b', 'a/b', false],
  ['[\\]a]', ']', true],
  ['[\\-]', '-', true],
  ['[x\\-]', 'x', true],
  ['[x\\-]', '-', true],
  ['[x\\-]', 'z', false],
  ['[\\-x]', 'x', true],
  ['[\\-x]', '-', true],
  ['[\\-x]', 'a', false],
  ['[]a]', ']', false, true],
  ['[-]', '-', false, true],
  ['[x-]', 'x', false, true],
  ['[x-]', '-', false, true],
  ['[x-]', 'z', false, true],
  ['[-x]', 'x', false, true],
  ['[-x]', '-', false, true],
  ['[-x]', 'a', false, true],
  ['\\', 'a', false, true],
  ['[a-b-c]', 'a', false, true],
  ['[', 'a', false, true],
  ['[^', 'a', false, true],
  ['[^bc', 'a', false, true],
  ['a[', 'a', false, true],
  ['a[', 'ab', false, true],
  ['a[', 'x', false, true],
  ['a/b[', 'x', false, true],
  ['*x', 'xxx', true],
];

t.test("Go's path.Match table", async (t) => {
  for (const [pattern, name, want, bad] of GO_TABLE) {
    t.equal(pathMatch(pattern, name), want, `Match(${JSON.stringify(pattern)}, ${JSON.stringify(name)})`);
    t.equal(isValidPattern(pattern), !bad, `valid(${JSON.stringify(pattern)})`);
  }
});

t.test('model-name globs', async (t) => {
  t.ok(pathMatch('claude-*', 'claude-sonnet-4-5'));
  t.notOk(pathMatch('claude-*', 'anthropic/claude-sonnet'), '* does not cross /');
  t.ok(pathMatch('*/claude-*', 'anthropic/claude-sonnet'));
  t.ok(pathMatch('gpt-4o-202[4-5]-*', 'gpt-4o-2024-08-06'));
  t.notOk(pathMatch('gpt-4o-202[4-5]-*', 'gpt-4o-2023-08-06'));
  t.ok(pathMatch('gpt-?o', 'gpt-4o'));
  t.notOk(pathMatch('gpt-4', 'gpt-4o'), 'a pattern must match the whole name');
  t.notOk(pathMatch('[', '['), 'malformed matches nothing, even itself');
});
