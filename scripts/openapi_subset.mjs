// openapi_subset.mjs - writes the part of the official OpenAI API description that the serve
// compatibility tests check replies against: the named schemas and every schema they reach
// through $ref, unchanged, with the source commit and licence (MIT, OpenAI) beside them.
//   node scripts/openapi_subset.mjs ../shared/data/openai-openapi/openapi.json tests/compat/openapi_subset.json
import fs from 'node:fs';

const [src, dst] = process.argv.slice(2);
if (!src || !dst) {
  console.error('usage: node scripts/openapi_subset.mjs OPENAPI_JSON OUT_JSON');
  process.exit(2);
}
const ROOTS = ['ListModelsResponse', 'CreateChatCompletionResponse', 'CreateChatCompletionStreamResponse',
  'CreateCompletionResponse', 'ErrorResponse'];
const spec = JSON.parse(fs.readFileSync(src, 'utf8'));
const all = spec.components.schemas;
const keep = {};
const todo = [...ROOTS];
while (todo.length) {
  const name = todo.pop();
  if (keep[name]) continue;
  if (!all[name]) throw new Error(`no schema ${name} in ${src}`);
  keep[name] = all[name];
  JSON.stringify(all[name], (k, v) => {
    if (k === '$ref' && typeof v === 'string') todo.push(v.split('/').pop());
    return v;
  });
}
const sorted = Object.fromEntries(Object.keys(keep).sort().map((k) => [k, keep[k]]));
const out = {
  'x-source': 'openai/openai-openapi at commit f85dbe223d40e1a31cba812ab2d755c7e98a92a3 (openapi.json), '
    + 'the schemas the serve compatibility tests use and those they reference; MIT License, '
    + 'Copyright (c) OpenAI (https://openai.com)',
  components: { schemas: sorted },
};
fs.writeFileSync(dst, JSON.stringify(out, null, 1) + '\n');
console.log(`${Object.keys(sorted).length} schemas -> ${dst}`);
