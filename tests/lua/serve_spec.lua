-- serve_spec.lua: `moonrl serve` on loopback (started here on a free port, stopped at the end),
-- driven by the engine's own client (rl.http.openai, profile "moonrl", and rl.http for the raw
-- wire): token-id completions whose logprobs equal the model's teacher-forced ones, the same
-- seed giving the same tokens as local sampling, chat with per-token logprobs (and with the prompt
-- given as ids), vLLM's /inference/v1/generate, streaming that matches the non-streamed answer,
-- OpenAI-shaped errors (400, 401, 404, 413, 429), batched decoding proved by the server's
-- counters, and load_weights switching to the new policy.
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local rl = require "moonrl"

local json = rl.json
local KEY = "sk-serve-test"
local CFG = { dim = 32, layers = 2, heads = 2, ctx = 96 }
local dir, pid, base
local model_a, model_b -- the served weights and the ones pushed later

local function new_model(seed)
  local c = { seed = seed }
  for k, v in pairs(CFG) do c[k] = v end
  return rl.model.new(c)
end

local server
local function start(extra)
  server = H.serve(dir .. "/a", "--api-key " .. KEY .. " " .. (extra or ""))
  base, pid = server.base, server.pid
end

-- SIGTERM; returns what the server's exit looked like (true when it exited with status 0).
local function stop()
  if not server then return end
  local ok, how, code = server.stop()
  server = nil
  return ok, how, code
end

local function raw(opts)
  return rl.http.client{ base_url = base, api_key = KEY, retries = 0, max_connections = 16,
                         timeout = 120 }
end

local function oai()
  return rl.http.openai{ base_url = base, profile = "moonrl", api_key = KEY, model = "moonrl",
                         retries = 0, timeout = 120 }
end

local function health(c)
  local own = not c
  c = c or raw()
  local status, _, body = c:get("/health")
  if own then c:close() end
  assert.equal(200, status)
  return json.decode(body)
end

local function post(path, body, c)
  c = c or raw()
  local status, headers, text = c:request{ method = "POST", path = path, body = body }
  return status, headers, json.decode(text)
end

-- The teacher-forced logprobs of `ids` after `prompt` under model m.
local function forced(m, prompt, ids)
  local seq = {}
  for _, t in ipairs(prompt) do seq[#seq + 1] = t end
  for _, t in ipairs(ids) do seq[#seq + 1] = t end
  local lp = m:logprobs{ tokens = { seq } }[1]
  local out = {}
  for i = 1, #ids do out[i] = lp[#prompt + i - 1] end
  return out
end

local function assert_close(want, got, tol)
  assert.equal(#want, #got)
  local worst = 0
  for i = 1, #want do worst = math.max(worst, math.abs(want[i] - got[i])) end
  assert.is_true(worst <= tol, string.format("max difference %.3g > %.3g", worst, tol))
end

local function assert_error_shape(status, body, want_status, want_type)
  assert.equal(want_status, status)
  assert.is_table(body.error)
  assert.is_string(body.error.message)
  assert.equal(want_type or "invalid_request_error", body.error.type)
  for _, k in ipairs{ "param", "code" } do
    assert.is_true(body.error[k] == json.null or type(body.error[k]) == "string", k)
  end
end

describe("moonrl serve", function()
  setup(function()
    dir = H.tmpdir()
    model_a, model_b = new_model(11), new_model(22)
    assert(model_a:save(dir .. "/a"))
    assert(model_b:save(dir .. "/b"))
    assert(model_a:save_checkpoint(dir .. "/a.bin", 0))
    assert(model_b:save_checkpoint(dir .. "/b.bin", 0))
    start("--max-queue 4 --max-batch 4 --max-body 4000000")
  end)
  teardown(function()
    stop()
    H.sh("rm -rf " .. H.shell_quote(dir))
  end)

  it("answers /health without a key and /v1/models with one", function()
    local h = health()
    assert.equal("ok", h.status)
    local c = raw()
    local status, _, body = c:get("/v1/models")
    assert.equal(200, status)
    local m = json.decode(body)
    assert.equal("list", m.object)
    assert.equal("moonrl", m.data[1].id)
    assert.equal("model", m.data[1].object)
    assert.equal("moonrl", m.data[1].owned_by)
    assert.equal(CFG.ctx, m.data[1].max_model_len)
  end)

  it("completes token-id prompts with logprobs equal to the model's teacher-forced ones", function()
    local c = oai()
    local prompt = { 72, 101, 108, 108, 111 }
    for _, temperature in ipairs{ 1, 0 } do
      local g = assert(c:generate{ prompt_ids = prompt, max_tokens = 12, temperature = temperature,
                                   seed = 5, extra = { ignore_eos = true } })
      assert.equal(12, #g.token_ids)
      assert.equal("length", g.finish_reason)
      assert_close(forced(model_a, prompt, g.token_ids), g.logprobs, 1e-5)
    end
    c:close()
  end)

  it("gives the same tokens for the same seed, the tokens local sampling gives", function()
    local c = oai()
    local prompt = { 1, 2, 3, 4 }
    local g1 = assert(c:generate{ prompt_ids = prompt, max_tokens = 10, temperature = 1, seed = 42,
                                  extra = { ignore_eos = true } })
    local g2 = assert(c:generate{ prompt_ids = prompt, max_tokens = 10, temperature = 1, seed = 42,
                                  extra = { ignore_eos = true } })
    local g3 = assert(c:generate{ prompt_ids = prompt, max_tokens = 10, temperature = 1, seed = 43,
                                  extra = { ignore_eos = true } })
    assert.same(g1.token_ids, g2.token_ids)
    assert.are_not.same(g1.token_ids, g3.token_ids)
    local here = model_a:generate{ prompts = { prompt }, max_new_tokens = 10, temperature = 1,
                                   seed = 42 }
    assert.same(here.tokens[1], g1.token_ids)
    c:close()
  end)

  it("serves vLLM's token-in/token-out /inference/v1/generate with the same tokens and logprobs", function()
    local prompt = { 9, 8, 7, 6 }
    local s, _, r = post("/inference/v1/generate", { token_ids = prompt, request_id = "ep-1",
      sampling_params = { max_tokens = 7, temperature = 1, seed = 12, ignore_eos = true } })
    assert.equal(200, s)
    assert.equal("ep-1", r.request_id)
    local ch = r.choices[1]
    assert.equal("length", ch.finish_reason)
    local lps = {}
    for i, e in ipairs(ch.logprobs.content) do lps[i] = e.logprob end
    assert_close(forced(model_a, prompt, ch.token_ids), lps, 1e-5)
    local o = oai()
    local g = assert(o:generate{ prompt_ids = prompt, max_tokens = 7, temperature = 1, seed = 12,
                                 extra = { ignore_eos = true } })
    o:close()
    assert.same(g.token_ids, ch.token_ids)
    local s2, _, bad = post("/inference/v1/generate", { token_ids = prompt,
                                                        sampling_params = { max_tokenz = 1 } })
    assert_error_shape(s2, bad, 400)
    assert.equal("max_tokenz", bad.error.param)
  end)

  it("completes string prompts with legacy logprobs, stop strings and top_logprobs", function()
    local status, _, r = post("/v1/completions", { prompt = "Hello", max_tokens = 6, logprobs = 3,
                                                   seed = 1, return_token_ids = true })
    assert.equal(200, status)
    assert.equal("text_completion", r.object)
    local ch = r.choices[1]
    assert.equal(0, ch.index)
    assert.equal(6, #ch.token_ids)
    assert.same({ 72, 101, 108, 108, 111 }, ch.prompt_token_ids)
    assert.equal(6, #ch.logprobs.token_logprobs)
    assert.equal(6, #ch.logprobs.tokens)
    assert.equal(6, #ch.logprobs.text_offset)
    for i = 1, 6 do
      -- (a dict keyed by token text: tokens that decode alike, as lone bytes do, share a key)
      local n = 0
      for _, v in pairs(ch.logprobs.top_logprobs[i]) do
        n = n + 1
        assert.is_true(v <= 0)
      end
      assert.is_true(n >= 1 and n <= 3)
    end
    assert.same({ prompt_tokens = 5, completion_tokens = 6, total_tokens = 11 }, r.usage)
    -- return_tokens_as_token_ids names each token "token_id:N"
    local _, _, named = post("/v1/completions", { prompt = "Hello", max_tokens = 6, logprobs = 0,
                                                  seed = 1, return_token_ids = true,
                                                  return_tokens_as_token_ids = true })
    for i, id in ipairs(named.choices[1].token_ids) do
      assert.equal("token_id:" .. id, named.choices[1].logprobs.tokens[i])
    end
    assert.same(ch.token_ids, named.choices[1].token_ids)
    -- a stop string cuts the text before it and ends with finish_reason "stop"
    local _, _, full = post("/v1/completions", { prompt = "Hello", max_tokens = 24, seed = 1,
                                                 return_token_ids = true, ignore_eos = true })
    local k
    for i, t in ipairs(full.choices[1].token_ids) do
      if t >= 33 and t <= 126 then k = k or i end
    end
    assert(k, "no printable token to stop at")
    local stop = string.char(full.choices[1].token_ids[k])
    local _, _, cut = post("/v1/completions", { prompt = "Hello", max_tokens = 24, seed = 1,
                                                stop = stop, return_token_ids = true,
                                                ignore_eos = true })
    local pos = full.choices[1].text:find(stop, 1, true)
    assert.equal("stop", cut.choices[1].finish_reason)
    assert.equal(full.choices[1].text:sub(1, pos - 1), cut.choices[1].text)
    assert.equal(k, cut.usage.completion_tokens)
  end)

  it("chats through the chat template with one logprob entry per completion token", function()
    local c = oai()
    local msgs = { { role = "system", content = "be brief" }, { role = "user", content = "hi" } }
    local text, info = c:chat(msgs, { logprobs = true, top_logprobs = 2, max_tokens = 8,
                                      seed = 3, temperature = 1 })
    assert(text, info)
    assert.equal(#info.logprobs, info.completion_tokens)
    local entry = info.choices[1].logprobs.content[1]
    assert.is_string(entry.token)
    assert.is_table(entry.bytes)
    assert.equal(2, #entry.top_logprobs)
    -- the prompt is the engine's chat template, as /tokenize renders it
    local _, _, tk = post("/tokenize", { messages = msgs })
    assert.equal(tk.count, info.prompt_tokens)
    local tok = rl.tokenizer.bytes()
    assert.same(tok:chat(msgs, { add_generation_prompt = true }), tk.tokens)
    c:close()
  end)

  it("takes the exact prompt ids on /v1/chat/completions/tokens (prime-rl's contract)", function()
    local msgs = { { role = "user", content = "ids" } }
    local ids = rl.tokenizer.bytes():chat(msgs, { add_generation_prompt = true })
    local s1, _, by_msgs = post("/v1/chat/completions", { messages = msgs, max_tokens = 6, seed = 2,
                                                          return_token_ids = true })
    local s2, _, by_ids = post("/v1/chat/completions/tokens", { messages = msgs, tokens = ids,
                                                                max_tokens = 6, seed = 2 })
    assert.equal(200, s1)
    assert.equal(200, s2)
    assert.same(by_msgs.choices[1].token_ids, by_ids.choices[1].token_ids)
    assert.equal(by_msgs.choices[1].message.content, by_ids.choices[1].message.content)
    assert.same(ids, by_ids.choices[1].prompt_token_ids)
    local s3, _, bad = post("/v1/chat/completions", { messages = msgs, tokens = ids })
    assert_error_shape(s3, bad, 400)
    assert.equal("tokens", bad.error.param)
  end)

  it("streams deltas that join to the non-streamed content, with a final usage chunk", function()
    local c = oai()
    local msgs = { { role = "user", content = "count" } }
    local opts = { max_tokens = 10, seed = 9, temperature = 1 }
    local whole, info = c:chat(msgs, opts)
    assert(whole, info)
    local parts = 0
    local streamed, sinfo = c:chat(msgs, { max_tokens = 10, seed = 9, temperature = 1,
                                           stream = function() parts = parts + 1 end })
    assert(streamed, sinfo)
    assert.equal(whole, streamed)
    assert.equal(info.completion_tokens, sinfo.completion_tokens)
    assert.equal(info.prompt_tokens, sinfo.prompt_tokens)
    assert.equal(info.finish_reason, sinfo.finish_reason)
    -- the raw stream: one [DONE], the usage chunk has choices = []
    local events, done, usage_chunk = {}, 0, nil
    local h = raw()
    local status = h:request{ method = "POST", path = "/v1/chat/completions",
      body = { messages = msgs, max_tokens = 4, stream = true, seed = 9,
               stream_options = { include_usage = true } },
      stream = function(ev)
        if ev.done then done = done + 1 return true end
        events[#events + 1] = ev.json
        if ev.json.usage ~= json.null and ev.json.usage then usage_chunk = ev.json end
        return true
      end }
    assert.equal(200, status)
    assert.equal(1, done)
    assert.equal("chat.completion.chunk", events[1].object)
    assert.equal("assistant", events[1].choices[1].delta.role)
    assert.same({}, usage_chunk.choices)
    assert.equal(4, usage_chunk.usage.completion_tokens)
    h:close()
    c:close()
  end)

  it("frees the slot of a stream whose client goes away, and goes on serving", function()
    local c = raw()
    local events = 0
    -- (the client stops reading after three events; whether the server sees the connection close
    -- before its 90 tokens are done depends on timing, so only the outcome is checked)
    c:request{ method = "POST", path = "/v1/completions",
      body = { prompt = { 1, 2 }, max_tokens = 90, ignore_eos = true, stream = true, seed = 4 },
      stream = function() events = events + 1 return events < 3 end }
    c:close()
    assert.equal(3, events)
    local h
    repeat h = health() until h.running == 0
    assert.equal(0, h.queued)
    local o = oai()
    assert(o:generate{ prompt_ids = { 3 }, max_tokens = 2 })
    o:close()
  end)

  it("answers bad requests with OpenAI-shaped errors", function()
    local c = raw()
    local status, _, text = c:request{ method = "POST", path = "/v1/completions", body = "{not json" }
    assert_error_shape(status, json.decode(text), 400)
    local s, _, b = post("/v1/completions", { prompt = { 1, 2 }, bogus = 1 }, c)
    assert_error_shape(s, b, 400)
    assert.equal("bogus", b.error.param)
    s, _, b = post("/v1/completions", { prompt = { 1, 2 }, temperature = "hot" }, c)
    assert_error_shape(s, b, 400)
    assert.equal("temperature", b.error.param)
    s, _, b = post("/v1/completions", { prompt = { 1, 99999 } }, c)
    assert_error_shape(s, b, 400)
    s, _, b = post("/v1/chat/completions", { messages = {} }, c)
    assert_error_shape(s, b, 400)
    s, _, b = post("/v1/completions", { prompt = { 1 }, model = "gpt-9" }, c)
    assert_error_shape(s, b, 404)
    assert.equal("model_not_found", b.error.code)
    local st, _, t404 = c:get("/v2/nothing")
    assert_error_shape(st, json.decode(t404), 404)
    -- 413: a body over --max-body
    s, _, b = post("/v1/completions", { prompt = string.rep("x", 4100000) }, c)
    assert_error_shape(s, b, 413)
    c:close()
    -- 401: no key, or a wrong one
    for _, key in ipairs{ false, "sk-wrong" } do
      local k = rl.http.client{ base_url = base, api_key = key or nil, retries = 0 }
      local st2, _, t2 = k:request{ method = "POST", path = "/v1/completions", body = { prompt = { 1 } } }
      assert_error_shape(st2, json.decode(t2), 401)
      k:close()
    end
    -- the openai client reports the status
    local o = oai()
    local g, msg, info = o:generate{ prompt_ids = { 1 }, max_tokens = 2, model = "nope" }
    assert.is_nil(g)
    assert.equal(404, info.status)
    assert.truthy(msg:find("does not exist"))
    o:close()
  end)

  it("rejects with 429 and Retry-After when the queue is full; queued requests batch together", function()
    local c = raw()
    assert.equal(200, (post("/pause", {}, c)))
    local before = health()
    local results = {}
    local function one(i)
      return function()
        local s, _, b = post("/v1/completions", { prompt = { 10 + i, 20, 30 }, max_tokens = 6,
                                                  seed = i, return_token_ids = true,
                                                  logprobs = 0, ignore_eos = true }, c)
        results[i] = { s, b }
      end
    end
    local rejected
    local function filler()
      -- wait until the four are queued (the server's counter says so), then overflow
      repeat local h = health(c) until h.queued == 4
      local s, headers, b = post("/v1/completions", { prompt = { 1 }, max_tokens = 1 }, c)
      rejected = { s, headers, b }
      post("/resume", {}, c)
    end
    c:run{ one(1), one(2), one(3), one(4), filler }
    assert_error_shape(rejected[1], rejected[3], 429, "rate_limit_error")
    assert.equal("1", rejected[2]["retry-after"])
    local after = health()
    assert.equal(before.rejected + 1, after.rejected)
    assert.equal(4, after.max_batch_seen) -- the four decoded in the same steps
    -- each batched answer is what the request gives alone, and its logprobs are the model's
    for i = 1, 4 do
      assert.equal(200, results[i][1])
      local ch = results[i][2].choices[1]
      local s, _, alone = post("/v1/completions", { prompt = { 10 + i, 20, 30 }, max_tokens = 6,
                                                    seed = i, return_token_ids = true,
                                                    ignore_eos = true }, c)
      assert.equal(200, s)
      assert.same(alone.choices[1].token_ids, ch.token_ids)
      assert_close(forced(model_a, { 10 + i, 20, 30 }, ch.token_ids), ch.logprobs.token_logprobs, 1e-5)
    end
    c:close()
  end)

  it("--batch-invariant: a request's tokens and logprobs are bit for bit the same alone and batched", function()
    -- the quickstart's size and 24 requests at once: without the flag, 98 of these 384 logprobs
    -- differed in the last bits between the batched and the lone runs (on the machine this was
    -- written on; a row's floats depend on how many rows the product has)
    local q = rl.model.new { vocab = 264, dim = 64, layers = 2, heads = 4, ffn = 192, ctx = 128, seed = 3 }
    assert(q:save(dir .. "/q"))
    local inv = H.serve(dir .. "/q", "--api-key " .. KEY .. " --batch-invariant --max-batch 32 --max-queue 64")
    finally(function() inv.stop() end) -- a failed assertion must not leave the server running
    local c = rl.http.client{ base_url = inv.base, api_key = KEY, retries = 0, max_connections = 64, timeout = 120 }
    local N = 24
    local function req(i)
      return { prompt = { 10 + i, 20, 30, 40 + i }, max_tokens = 16, seed = i, return_token_ids = true,
               logprobs = 0, ignore_eos = true }
    end
    local alone = {}
    for i = 1, N do
      local s, _, b = post("/v1/completions", req(i), c)
      assert.equal(200, s)
      alone[i] = b.choices[1]
    end
    assert.equal(1, health(c).max_batch_seen) -- one at a time so far
    assert.equal(200, (post("/pause", {}, c)))
    local batched, fns = {}, {}
    for i = 1, N do
      fns[i] = function() local s, _, b = post("/v1/completions", req(i), c) batched[i] = { s, b } end
    end
    fns[N + 1] = function()
      repeat local h = health(c) until h.queued == N
      post("/resume", {}, c)
    end
    c:run(fns)
    assert.equal(N, health(c).max_batch_seen) -- all of them in the same decode steps
    for i = 1, N do
      assert.equal(200, batched[i][1])
      local ch = batched[i][2].choices[1]
      assert.same(alone[i].token_ids, ch.token_ids)
      assert.same(alone[i].logprobs.token_logprobs, ch.logprobs.token_logprobs) -- exactly
      assert_close(forced(q, req(i).prompt, ch.token_ids), ch.logprobs.token_logprobs, 1e-5)
    end
    c:close()
    assert.is_true((inv.stop()))
  end)

  it("load_weights switches to the pushed policy (a model directory, or checkpoint bytes)", function()
    local c = oai()
    local prompt = { 5, 6, 7, 8 }
    local function greedy()
      return assert(c:generate{ prompt_ids = prompt, max_tokens = 8, temperature = 0,
                                extra = { ignore_eos = true } })
    end
    local g_a = greedy()
    assert_close(forced(model_a, prompt, g_a.token_ids), g_a.logprobs, 1e-5)
    local v0 = health().policy_version
    local s, _, r = post("/v1/load_weights", { path = dir .. "/b" })
    assert.equal(200, s)
    assert.equal(v0 + 1, r.policy_version)
    local g_b = greedy()
    local here = model_b:generate{ prompts = { prompt }, max_new_tokens = 8, temperature = 0 }
    assert.same(here.tokens[1], g_b.token_ids)
    assert_close(forced(model_b, prompt, g_b.token_ids), g_b.logprobs, 1e-5)
    -- the raw bytes of a moonrl checkpoint bring model a back
    local f = assert(io.open(dir .. "/a.bin", "rb"))
    local bytes = f:read("a")
    f:close()
    local h = raw()
    local st = h:request{ method = "POST", path = "/v1/load_weights", body = bytes,
                          headers = { ["Content-Type"] = "application/octet-stream" } }
    assert.equal(200, st)
    h:close()
    assert.same(g_a.token_ids, greedy().token_ids)
    assert.equal(v0 + 2, health().policy_version)
    -- a checkpoint path works too, and a bad one is a 400 that leaves the policy as it was
    assert.equal(200, (post("/v1/load_weights", { path = dir .. "/b.bin" })))
    assert.same(g_b.token_ids, greedy().token_ids)
    local bs, _, bb = post("/v1/load_weights", { path = dir .. "/missing" })
    assert_error_shape(bs, bb, 400)
    assert.same(g_b.token_ids, greedy().token_ids)
    c:close()
  end)

  it("stops on SIGTERM with exit status 0 (and, in the sanitizer build, no leak report)", function()
    local ok, how, code = stop()
    assert.is_true(ok, string.format("moonrl serve ended by %s %s", tostring(how), tostring(code)))
  end)
end)

-- Tool calls: tools described in the prompt, earlier calls and results rendered back, calls read
-- out of the text, and tool_choice "required" or a named function forcing a well-formed call by
-- masking every token that would break it (the served model here is untrained).
describe("moonrl serve tool calls", function()
  local tdir, hermes, line
  local tool_list = {
    { type = "function", ["function"] = { name = "get_weather", description = "the weather",
      parameters = { type = "object", properties = { city = { type = "string" } } } } },
    { type = "function", ["function"] = { name = "now" } },
  }
  local msgs = { { role = "user", content = "weather in Paris?" } }
  local function client(s)
    return rl.http.client{ base_url = s.base, retries = 0, timeout = 120 }
  end
  local function call(s, body)
    local c = client(s)
    local status, _, text = c:request{ method = "POST", path = "/v1/chat/completions", body = body }
    c:close()
    return status, json.decode(text)
  end
  local function with(extra)
    local b = { messages = msgs, tools = tool_list, max_tokens = 160, return_token_ids = true }
    for k, v in pairs(extra) do b[k] = v end
    return b
  end
  local PREFIX = '<tool_call>\n{"name": "'
  setup(function()
    tdir = H.tmpdir()
    assert(rl.model.new{ dim = 32, layers = 2, heads = 2, ctx = 1024, seed = 5 }:save(tdir .. "/m"))
    hermes = H.serve(tdir .. "/m", "")
    line = H.serve(tdir .. "/m", "--tool-format line")
  end)
  teardown(function()
    if hermes then hermes.stop() end
    if line then line.stop() end
    H.sh("rm -rf " .. H.shell_quote(tdir))
  end)

  it("forces a named function: a complete call whose arguments decode, or a call cut by length", function()
    local complete = 0
    for seed = 1, 6 do
      local status, r = call(hermes, with{ seed = seed, logprobs = true,
        tool_choice = { type = "function", ["function"] = { name = "get_weather" } } })
      assert.equal(200, status)
      local choice = r.choices[1]
      assert.equal(r.usage.completion_tokens, #choice.logprobs.content)
      local text = table.concat((function()
        local t = {}
        for i, e in ipairs(choice.logprobs.content) do t[i] = e.token end
        return t
      end)())
      local forced = PREFIX .. 'get_weather", "arguments": '
      assert.equal(forced, text:sub(1, #forced))
      -- the forced bytes had one allowed token each: logprob exactly 0 (byte tokenizer)
      for i = 1, #forced do assert.equal(0, choice.logprobs.content[i].logprob) end
      if choice.finish_reason == "tool_calls" then
        complete = complete + 1
        local tc = choice.message.tool_calls
        assert.equal(1, #tc)
        assert.equal("get_weather", tc[1]["function"].name)
        assert.equal("function", tc[1].type)
        assert.is_table(json.decode(tc[1]["function"].arguments))
        assert.equal(json.null, choice.message.content)
      else
        assert.equal("length", choice.finish_reason)
        assert.equal(160, r.usage.completion_tokens)
      end
    end
    assert.is_true(complete >= 1, "no complete call in 6 seeds")
  end)

  it("required: the first name byte is drawn between the tools, as the model weighs them", function()
    local status, r = call(hermes, with{ seed = 3, tool_choice = "required", logprobs = true,
                                         top_logprobs = 5, max_tokens = 30 })
    assert.equal(200, status)
    local at = #PREFIX + 1 -- the first byte of the name: "g" (get_weather) or "n" (now)
    local entry = r.choices[1].logprobs.content[at]
    local alts = {}
    for _, t in ipairs(entry.top_logprobs) do alts[t.token] = t.logprob end
    assert.same({ "g", "n" }, (function()
      local k = {}
      for t in pairs(alts) do k[#k + 1] = t end
      table.sort(k)
      return k
    end)())
    assert.is_true(math.abs(math.exp(alts.g) + math.exp(alts.n) - 1) < 1e-5)
    -- against the model's own teacher-forced logprobs of the two bytes in that context
    local m = assert(rl.model.load(tdir .. "/m"))
    local ctx = {}
    for _, id in ipairs(r.choices[1].prompt_token_ids) do ctx[#ctx + 1] = id end
    for i = 1, at - 1 do ctx[#ctx + 1] = r.choices[1].token_ids[i] end
    local function next_lp(byte)
      local seq = { table.unpack(ctx) }
      seq[#seq + 1] = byte
      local lp = m:logprobs{ tokens = { seq } }[1]
      return lp[#seq - 1]
    end
    local want = next_lp(string.byte("g")) - next_lp(string.byte("n"))
    assert.is_true(math.abs((alts.g - alts.n) - want) < 1e-4,
      string.format("served difference %.6f, teacher-forced %.6f", alts.g - alts.n, want))
  end)

  it("streams a forced call as a tool_calls delta equal to the non-streamed call", function()
    local o = rl.http.openai{ base_url = hermes.base, profile = "moonrl", model = "moonrl", retries = 0 }
    local opts = { tools = tool_list, tool_choice = { type = "function", ["function"] = { name = "now" } },
                   seed = 4, max_tokens = 80 }
    local _, whole = o:chat(msgs, opts)
    opts.stream = function() end
    local text, streamed = o:chat(msgs, opts)
    assert.equal("", text)
    assert.equal("tool_calls", whole.finish_reason)
    assert.equal("tool_calls", streamed.finish_reason)
    whole.tool_calls[1].id, streamed.tool_calls[1].id = nil, nil -- one per request
    assert.same(whole.tool_calls, streamed.tool_calls)
    assert.equal("now", streamed.tool_calls[1]["function"].name)
    assert.equal("{}", streamed.tool_calls[1]["function"].arguments)
    o:close()
  end)

  it("renders tools, earlier calls and tool results into the prompt", function()
    local conv = {
      { role = "system", content = "be brief" },
      { role = "user", content = "weather?" },
      { role = "assistant", content = json.null, tool_calls = { { id = "c1", type = "function",
        ["function"] = { name = "get_weather", arguments = '{"city": "Paris"}' } } } },
      { role = "tool", tool_call_id = "c1", content = "sunny" },
    }
    local function prompt_text(s)
      local status, r = call(s, { messages = conv, tools = tool_list, max_tokens = 1,
                                  return_token_ids = true })
      assert.equal(200, status)
      local c = client(s)
      local st, _, body = c:request{ method = "POST", path = "/detokenize",
                                     body = { tokens = r.choices[1].prompt_token_ids } }
      c:close()
      assert.equal(200, st)
      return json.decode(body).prompt
    end
    local h = prompt_text(hermes)
    assert.truthy(h:find('be brief\n\nTools you can call', 1, true))
    assert.truthy(h:find('{"name":"get_weather","description":"the weather","parameters":', 1, true))
    assert.truthy(h:find('<tool_call>\n{"name": "get_weather", "arguments": {"city":"Paris"}}\n</tool_call>', 1, true))
    assert.truthy(h:find("<tool_response>\nsunny\n</tool_response>", 1, true))
    local l = prompt_text(line)
    assert.truthy(l:find("- get_weather <city>:", 1, true))
    assert.truthy(l:find("CALL get_weather Paris", 1, true))
    assert.falsy(l:find("<tool_response>", 1, true))
  end)

  it("--tool-format line: a forced call is a CALL line, its arguments by the schema's order", function()
    local status, r = call(line, with{ seed = 2,
      tool_choice = { type = "function", ["function"] = { name = "now" } } })
    assert.equal(200, status)
    assert.equal("tool_calls", r.choices[1].finish_reason)
    assert.equal("now", r.choices[1].message.tool_calls[1]["function"].name)
    assert.equal("{}", r.choices[1].message.tool_calls[1]["function"].arguments)
    local ids = r.choices[1].token_ids
    local bytes = {}
    for i, id in ipairs(ids) do bytes[i] = string.char(id) end
    assert.equal("CALL now\n", table.concat(bytes))
  end)

  it("answers bad tool requests with 400s naming the field", function()
    local cases = {
      { { tools = { { type = "function", ["function"] = { name = "bad name" } } } }, "tools" },
      { { tools = { { type = "function" } } }, "tools" },
      { { tool_choice = { type = "function", ["function"] = { name = "rain" } } }, "tool_choice" },
      { { tool_choice = "always" }, "tool_choice" },
      { { parallel_tool_calls = "yes" }, "parallel_tool_calls" },
    }
    for i, case in ipairs(cases) do
      local status, r = call(hermes, with(case[1]))
      assert.equal(400, status, "case " .. i)
      assert.equal(case[2], r.error.param, "case " .. i)
    end
    local status, r = call(hermes, { messages = msgs, tool_choice = "required" })
    assert.equal(400, status)
    assert.equal("tool_choice", r.error.param)
    status, r = call(hermes, { messages = { { role = "assistant", tool_calls = { { type = "function",
      ["function"] = { name = "now", arguments = "{oops" } } } } }, tools = tool_list })
    assert.equal(400, status)
    assert.equal("messages", r.error.param)
    assert.truthy(r.error.message:find("JSON object", 1, true))
  end)
end)
