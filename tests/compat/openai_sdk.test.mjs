// openai_sdk.test.mjs - the official openai npm client (pinned in package.json, installed by the
// Makefile under <build>/compat) against `moonrl serve` on loopback, run with `node --test`:
// models, chat with logprobs, streaming that joins to the non-streamed answer with a usage chunk,
// a forced tool_choice (a call whose arguments parse, streamed and not),
// token-id completions, the SDK's error classes, and a 429 the SDK retries until the queue frees.
// Every reply is also checked against the official OpenAPI schemas
// (MOONRL_OPENAPI, else tests/compat/openapi_subset.json).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, execFileSync } from 'node:child_process';
import { createRequire } from 'node:module';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

const root = process.env.MOONRL_ROOT;
const moonrl = path.join(process.env.MOONRL_BUILD, 'moonrl');
const require = createRequire(path.join(process.env.MOONRL_COMPAT, 'package.json'));
const { OpenAI } = require('openai');
const KEY = 'sk-compat';

// ---- a small validator for the OpenAPI schemas: type, nullable, enum, required, properties,
// items, anyOf/oneOf (one must match), allOf and $ref; extra properties are allowed (vLLM-style
// fields such as token_ids)
// MOONRL_OPENAPI, else the checkout's subset of it (tests/compat/openapi_subset.json, written by
// scripts/openapi_subset.mjs from the official file: the schemas below and all they reference)
const specPath = process.env.MOONRL_OPENAPI || path.join(root, 'tests/compat/openapi_subset.json');
const spec = JSON.parse(fs.readFileSync(specPath, 'utf8'));

function typeOk(t, v) {
  switch (t) {
    case 'null': return v === null;
    case 'integer': return Number.isInteger(v);
    case 'number': return typeof v === 'number';
    case 'array': return Array.isArray(v);
    case 'object': return v !== null && typeof v === 'object' && !Array.isArray(v);
    default: return typeof v === t;
  }
}

function check(schema, v, where, errs) {
  if (v === null && schema.nullable) return; // (nullable may sit beside a $ref)
  if (schema.$ref) schema = spec.components.schemas[schema.$ref.split('/').pop()];
  if (v === null && schema.nullable) return;
  if (schema.type) {
    const types = Array.isArray(schema.type) ? schema.type : [schema.type];
    if (!types.some((t) => typeOk(t, v))) {
      errs.push(`${where}: ${JSON.stringify(v)} is not ${types.join('|')}`);
      return;
    }
  }
  if (schema.enum && !schema.enum.includes(v)) errs.push(`${where}: ${JSON.stringify(v)} not in enum`);
  for (const alt of ['anyOf', 'oneOf']) {
    if (!schema[alt]) continue;
    const ok = schema[alt].some((s) => { const e = []; check(s, v, where, e); return e.length === 0; });
    if (!ok) errs.push(`${where}: matches none of ${alt}`);
  }
  for (const s of schema.allOf || []) check(s, v, where, errs);
  if (typeOk('object', v)) {
    for (const k of schema.required || []) if (!(k in v)) errs.push(`${where}: no ${k}`);
    for (const [k, s] of Object.entries(schema.properties || {})) {
      if (k in v) check(s, v[k], `${where}.${k}`, errs);
    }
  }
  if (Array.isArray(v) && schema.items) v.forEach((x, i) => check(schema.items, x, `${where}[${i}]`, errs));
}

function conforms(name, value) {
  const errs = [];
  check({ $ref: `#/components/schemas/${name}` }, value, name, errs);
  assert.deepEqual(errs, [], `the reply does not match ${name}`);
}

// ---- the server

let dir, server, base;

before(async () => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'moonrl-compat-'));
  execFileSync(moonrl, ['-e', `local rl = require "moonrl"
    assert(rl.model.new{dim = 32, layers = 2, heads = 2, ctx = 512, seed = 7}:save(arg[1]))`,
  path.join(dir, 'm')]);
  server = spawn(moonrl, ['serve', '--model', path.join(dir, 'm'), '--port', '0', '--api-key', KEY,
    '--max-queue', '2', '--max-batch', '2'], { stdio: ['ignore', 'pipe', 'inherit'] });
  base = await new Promise((resolve, reject) => {
    let out = '';
    server.stdout.on('data', (d) => {
      out += d;
      const m = out.match(/listening on (http:\/\/127\.0\.0\.1:\d+)/);
      if (m) resolve(m[1]);
    });
    server.on('exit', (code) => reject(new Error(`moonrl serve exited with ${code}`)));
  });
});

after(async () => {
  const exited = new Promise((resolve) => server.on('exit', (code) => resolve(code)));
  server.kill('SIGTERM');
  assert.equal(await exited, 0);
  fs.rmSync(dir, { recursive: true, force: true });
});

const client = (opts = {}) => new OpenAI({ apiKey: KEY, baseURL: `${base}/v1`, maxRetries: 0, ...opts });

async function raw(method, p, body) {
  const r = await fetch(base + p, {
    method, headers: { Authorization: `Bearer ${KEY}`, 'Content-Type': 'application/json' },
    body: body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body),
  });
  return { status: r.status, headers: r.headers, json: await r.json() };
}

const messages = [{ role: 'system', content: 'be brief' }, { role: 'user', content: 'hello' }];

test('models.list names the served model', async () => {
  const list = await client().models.list();
  assert.equal(list.data[0].id, 'moonrl');
  assert.equal(list.data[0].owned_by, 'moonrl');
  conforms('ListModelsResponse', (await raw('GET', '/v1/models')).json);
});

test('chat.completions.create gives one logprobs entry per completion token', async () => {
  const r = await client().chat.completions.create({
    model: 'moonrl', messages, max_tokens: 8, logprobs: true, top_logprobs: 2, seed: 3,
  });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(typeof r.choices[0].message.content, 'string');
  assert.equal(r.choices[0].logprobs.content.length, r.usage.completion_tokens);
  assert.equal(r.choices[0].logprobs.content[0].top_logprobs.length, 2);
  conforms('CreateChatCompletionResponse', r);
});

test('a stream joins to the non-streamed content and ends with a usage chunk', async () => {
  const c = client();
  const whole = await c.chat.completions.create({ model: 'moonrl', messages, max_tokens: 12, seed: 5 });
  const stream = await c.chat.completions.create({
    model: 'moonrl', messages, max_tokens: 12, seed: 5, stream: true,
    stream_options: { include_usage: true },
  });
  let text = '';
  let last;
  let finish;
  for await (const chunk of stream) {
    conforms('CreateChatCompletionStreamResponse', chunk);
    if (chunk.choices.length) {
      text += chunk.choices[0].delta.content ?? '';
      finish = chunk.choices[0].finish_reason ?? finish;
    }
    last = chunk;
  }
  assert.equal(text, whole.choices[0].message.content);
  assert.equal(finish, whole.choices[0].finish_reason);
  assert.deepEqual(last.choices, []);
  assert.deepEqual(last.usage, whole.usage);
});

test('a forced tool_choice gives a tool call whose arguments parse, one logprob per token', async () => {
  const tools = [{ type: 'function', function: { name: 'get_time', description: 'the time now',
    parameters: { type: 'object', properties: {} } } }];
  const ask = { model: 'moonrl', messages: [{ role: 'user', content: 'time?' }], tools,
    tool_choice: { type: 'function', function: { name: 'get_time' } }, max_tokens: 64, seed: 1 };
  const c = client();
  const r = await c.chat.completions.create({ ...ask, logprobs: true });
  const choice = r.choices[0];
  assert.equal(choice.finish_reason, 'tool_calls');
  assert.equal(choice.message.tool_calls.length, 1);
  assert.equal(choice.message.tool_calls[0].type, 'function');
  assert.equal(choice.message.tool_calls[0].function.name, 'get_time');
  assert.deepEqual(JSON.parse(choice.message.tool_calls[0].function.arguments), {});
  assert.equal(choice.logprobs.content.length, r.usage.completion_tokens);
  conforms('CreateChatCompletionResponse', r);
  // streamed: the call comes as a tool_calls delta, and the SDK's chunks conform too
  const stream = await c.chat.completions.create({ ...ask, stream: true });
  let name = '', args = '', finish;
  for await (const chunk of stream) {
    conforms('CreateChatCompletionStreamResponse', chunk);
    for (const d of chunk.choices[0]?.delta?.tool_calls ?? []) {
      assert.equal(d.index, 0);
      name += d.function?.name ?? '';
      args += d.function?.arguments ?? '';
    }
    finish = chunk.choices[0]?.finish_reason ?? finish;
  }
  assert.equal(finish, 'tool_calls');
  assert.equal(name, 'get_time');
  assert.deepEqual(JSON.parse(args), {});
});

test('completions.create takes token ids and returns them with their logprobs', async () => {
  const r = await client().completions.create({
    model: 'moonrl', prompt: [72, 101, 108, 108, 111], max_tokens: 5, logprobs: 1, seed: 1,
    return_token_ids: true, ignore_eos: true,
  });
  assert.equal(r.choices[0].token_ids.length, 5);
  assert.equal(r.choices[0].logprobs.token_logprobs.length, 5);
  assert.equal(r.usage.prompt_tokens, 5);
  conforms('CreateCompletionResponse', r);
});

test('errors come as the SDK error classes, shaped as the API says', async () => {
  const c = client();
  await assert.rejects(c.chat.completions.create({ model: 'moonrl', messages, bogus: 1 }),
    (e) => e instanceof OpenAI.BadRequestError && e.status === 400);
  await assert.rejects(c.chat.completions.create({ model: 'gpt-nope', messages }),
    (e) => e instanceof OpenAI.NotFoundError && e.status === 404);
  await assert.rejects(client({ apiKey: 'sk-wrong' }).models.list(),
    (e) => e instanceof OpenAI.AuthenticationError && e.status === 401);
  const bad = await raw('POST', '/v1/chat/completions', '{"messages": [');
  assert.equal(bad.status, 400);
  assert.equal(bad.json.error.type, 'invalid_request_error');
  conforms('ErrorResponse', bad.json);
  conforms('ErrorResponse', (await raw('POST', '/v1/completions', { prompt: [1], model: 'x' })).json);
});

test('a full queue answers 429 with Retry-After and the SDK retries until it succeeds', async () => {
  const health = async () => (await raw('GET', '/health')).json;
  assert.equal((await raw('POST', '/pause', {})).status, 200);
  const rejectedBefore = (await health()).rejected;
  const queued = [1, 2].map((i) => raw('POST', '/v1/completions', { prompt: [i], max_tokens: 2 }));
  while ((await health()).queued < 2) await new Promise((r) => setTimeout(r, 20));
  const overflow = await raw('POST', '/v1/completions', { prompt: [3], max_tokens: 2 });
  assert.equal(overflow.status, 429);
  assert.equal(overflow.headers.get('retry-after'), '1');
  conforms('ErrorResponse', overflow.json);
  const retried = client({ maxRetries: 5 }).completions.create({ model: 'moonrl', prompt: [4], max_tokens: 2 });
  // resume once the server has turned the SDK's first attempt away as well
  while ((await health()).rejected < rejectedBefore + 2) await new Promise((r) => setTimeout(r, 20));
  await raw('POST', '/resume', {});
  const r = await retried;
  assert.equal(r.choices[0].finish_reason.length > 0, true);
  for (const q of await Promise.all(queued)) assert.equal(q.status, 200);
});
