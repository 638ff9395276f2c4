-- http_spec.lua: rl.http and rl.http.openai against the scripted loopback server
-- (build/tests/mock_server, started here and stopped at the end; no network): requests, keys and
-- JSON bodies, option errors that name the key, retries seen from Lua, streaming callbacks,
-- timeouts, coroutine tasks with N requests in flight at once, the judge client interface, the
-- profiles' generate mapping, and doubles that survive a trip through the server bit for bit.
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local rl = require "moonrl"

local json = rl.json
local server, base

local function start_server()
  server = assert(io.popen(H.shell_quote(H.build .. "/tests/mock_server") .. " 120", "r"))
  local port = assert(server:read("l"), "the mock server printed no port")
  base = "http://127.0.0.1:" .. port
end

local function stop_server()
  local c = rl.http.client{ base_url = base, retries = 0 }
  c:get("/quit")
  c:close()
  server:close()
end

local function stats()
  local c = rl.http.client{ base_url = base, retries = 0 }
  local _, _, body = c:get("/stats")
  c:close()
  return json.decode(body)
end

describe("rl.http", function()
  setup(start_server)
  teardown(stop_server)

  it("makes requests with a base URL, the API key, headers and JSON bodies", function()
    local c = rl.http.client{ base_url = base .. "/", api_key = "sk-1", headers = { ["X-Test"] = "client" } }
    local status, headers, body = c:request{ path = "/echo?q=1" }
    assert.equal(200, status)
    assert.equal("application/json", headers["content-type"])
    local echo = json.decode(body)
    assert.same({ "GET", "/echo", "q=1", "Bearer sk-1", "client" },
      { echo.method, echo.path, echo.query, echo.authorization, echo.x_test })
    status, _, body = c:post("echo", { a = { 1, 2.5 } }, { ["x-test"] = "request" })
    echo = json.decode(body)
    assert.equal(200, status)
    assert.same({ "POST", '{"a":[1,2.5]}', "request" }, { echo.method, echo.body, echo.x_test })
    status, _, body = c:request{ method = "PUT", url = base .. "/echo", body = "raw" }
    assert.same({ "PUT", "raw" }, { json.decode(body).method, json.decode(body).body })
    assert.equal(404, (c:get("/nowhere")))
    c:close()
  end)

  it("names unknown and wrong options", function()
    H.assert_error(function() rl.http.client{ base_url = base, retires = 3 } end,
      "rl.http.client: unknown field 'retires' (did you mean 'retries'?)")
    H.assert_error(function() rl.http.client{ max_connections = 0 } end,
      "rl.http.client: max_connections: a positive integer expected, got 0")
    H.assert_error(function() rl.http.client{ timeout = -1 } end, "timeout: a positive number expected")
    H.assert_error(function() rl.http.client{ headers = { 1 } } end, "headers: a table of string names")
    local c = rl.http.client{ base_url = base }
    H.assert_error(function() c:request{ path = "/echo", bodyy = "x" } end, "request: unknown field 'bodyy'")
    H.assert_error(function() c:request{} end, "request: path or url expected")
    H.assert_error(function() c:request{ url = "ftp://x/y" } end, "not an http:// or https:// URL")
    H.assert_error(function() rl.http.client{}:request{ path = "/x" } end, "the client has no base_url")
    H.assert_error(function() rl.http.openai{ base_url = base, profile = "vlm" } end,
      'profile: one of "openai", "vllm", "sglang", "llamacpp", "moonrl" (did you mean "vllm"?)')
    H.assert_error(function() rl.http.openai{ profile = "vllm" } end, "base_url")
    local o = rl.http.openai{ base_url = base }
    H.assert_error(function() o:chat{ messages = {}, temprature = 0 } end, "chat: unknown field 'temprature'")
    c:close()
  end)

  it("retries 503 and resets, honours Retry-After, and returns the last status when retries run out", function()
    local c = rl.http.client{ base_url = base, retries = 2, backoff = 0.01 }
    assert.equal(200, (c:get("/status?code=503&key=lua-a&fail=2")))
    assert.equal(200, (c:get("/reset?key=lua-b&fail=2")))
    local t0 = rl.clock()
    assert.equal(200, (c:get("/status?code=429&key=lua-c&fail=1&retry_after=1")))
    assert.is_true(rl.clock() - t0 >= 1.0)
    assert.equal(503, (c:get("/status?code=503&key=lua-d")))
    local h = stats().hits
    assert.same({ 3, 3, 2, 3 }, { h["lua-a"], h["lua-b"], h["lua-c"], h["lua-d"] })
    c:close()
    c = rl.http.client{ base_url = base, retries = 0 }
    local status, msg, info = c:get("/reset?key=lua-e")
    assert.is_nil(status)
    assert.matches("attempt 1 of 1", msg)
    assert.same({ "failed", 1 }, { info.outcome, info.attempts })
    c:close()
  end)

  it("streams events to a callback and never retries after the first streamed byte", function()
    local c = rl.http.client{ base_url = base, retries = 3, backoff = 0.01 }
    local seen = {}
    local status, _, body = c:request{ path = "/sse?n=4&eol=crlf", stream = function(ev)
      seen[#seen + 1] = ev.done and "DONE" or ev.json.i
    end }
    assert.equal(200, status)
    assert.equal("", body)
    assert.same({ 0, 1, 2, 3, "DONE" }, seen)
    seen = {}
    local s, msg, info = c:request{ path = "/sse?n=6&delay_ms=30&reset_after=2&key=lua-sse",
      stream = function(ev) seen[#seen + 1] = ev.json.i end }
    assert.is_nil(s)
    assert.matches("not retried", msg)
    assert.same({ "failed", 1 }, { info.outcome, info.attempts })
    assert.same({ 0, 1 }, seen)
    assert.equal(1, stats().hits["lua-sse"])
    -- the callback stops the stream by returning false
    seen = {}
    s, msg, info = c:request{ path = "/sse?n=50&delay_ms=5", stream = function(ev)
      seen[#seen + 1] = ev.json.i
      return #seen < 3 and true or false
    end }
    assert.is_nil(s)
    assert.equal("stopped", info.outcome)
    assert.same({ 0, 1, 2 }, seen)
    c:close()
  end)

  it("times out slow and silent responses", function()
    local c = rl.http.client{ base_url = base, retries = 0, timeout = 0.2 }
    local s, msg, info = c:get("/slow?ms=1500")
    assert.is_nil(s) -- the response would have come (200) had the timeout not fired
    assert.is_true(info.timeout)
    assert.equal(200, (c:request{ path = "/slow?ms=300", timeout = 2 }))
    c:close()
    c = rl.http.client{ base_url = base, retries = 0, idle_timeout = 0.25 }
    s, msg = c:get("/stall?ms=2000")
    assert.is_nil(s)
    assert.matches("nothing received for 250 ms", msg)
    c:close()
  end)

  it("runs requests from coroutine tasks, all in flight at once, under the connection limit", function()
    local c = rl.http.client{ base_url = base, max_connections = 8 }
    c:get("/reset_stats")
    local fns = {}
    for i = 1, 8 do fns[i] = function() return c:get("/hold?ms=300"), i end end
    local res = c:run(fns)
    for i = 1, 8 do assert.same({ 200, i }, { res[i][1], res[i][2] }) end
    assert.equal(8, stats().max_inflight) -- the server held all eight at once
    c:close()
    -- 24 tasks through 3 connections: never more than 3 at once
    c = rl.http.client{ base_url = base, max_connections = 3 }
    c:get("/reset_stats")
    fns = {}
    for i = 1, 24 do fns[i] = function() return (c:get("/hold?ms=20")) end end
    res = c:run(fns)
    for i = 1, 24 do assert.equal(200, res[i][1]) end
    local st = stats()
    assert.equal(3, st.max_inflight)
    c:close()
    -- spawn and wait; a task's error comes out of wait
    c = rl.http.client{ base_url = base }
    local a = c:spawn(function(x) local s = c:get("/hold?ms=50") return s, x end, "x")
    local b = c:spawn(function() c:get("/hold?ms=10") error("boom") end)
    assert.same({ 200, "x" }, { c:wait(a) })
    H.assert_error(function() c:wait(b) end, "boom")
    c:close()
  end)

  it("carries doubles through the server and back bit for bit (subnormals, signed zeros, extremes)", function()
    local rng = rl.rng(11)
    local xs = { 0.0, -0.0, 5e-324, -5e-324, 2.2250738585072009e-308, 1.7976931348623157e308,
      -1.7976931348623157e308, 1e-300, 0.1, 1 / 3, -9999.0 }
    while #xs < 2000 do
      local hi, lo = rng:random(0, 0xffffffff), rng:random(0, 0xffffffff)
      local x = string.unpack("<d", string.pack("<I4I4", lo, hi))
      if x == x and x ~= math.huge and x ~= -math.huge then xs[#xs + 1] = x end
    end
    local c = rl.http.client{ base_url = base }
    local _, _, body = c:post("/echo", { xs = xs })
    local back = json.decode(json.decode(body).body).xs
    assert.equal(#xs, #back)
    for i, x in ipairs(xs) do
      if string.pack("<d", back[i]) ~= string.pack("<d", x) then
        error(("%.17g came back as %.17g"):format(x, back[i]))
      end
    end
    c:close()
  end)
end)

describe("rl.http.openai", function()
  setup(start_server)
  teardown(stop_server)

  it("chats with the judge client interface and the table form", function()
    local o = rl.http.openai{ base_url = base, profile = "vllm", model = "judge" }
    local text, info = o:chat({ { role = "user", content = "score this" } }, { temperature = 0, max_tokens = 5 })
    assert.equal("reply to: score this", text)
    assert.same({ 3, 4, "stop", false }, { info.prompt_tokens, info.completion_tokens, info.finish_reason, info.token_exact })
    local sent = info.response.echo
    assert.same({ "judge", 0, 5 }, { sent.model, sent.temperature, sent.max_tokens })
    text, info = o:chat{ messages = { { role = "user", content = "a b" } }, n = 2, logprobs = true }
    assert.equal(2, #info.choices)
    assert.same({ -0.125, -0.25, -0.375, -0.5 }, info.logprobs)
    -- tools: the reply's tool call comes back in info
    text, info = o:chat{ messages = { { role = "user", content = "x" } }, tools = {
      { type = "function", ["function"] = { name = "lookup", parameters = { type = "object" } } } },
      tool_choice = "required" }
    assert.equal("", text)
    assert.equal("tool_calls", info.finish_reason)
    assert.equal("lookup", info.tool_calls[1]["function"].name)
    assert.same({ q = 1 }, json.decode(info.tool_calls[1]["function"].arguments))
    -- the openai profile sends max_completion_tokens
    local oa = rl.http.openai{ base_url = base, profile = "openai" }
    _, info = oa:chat({ { role = "user", content = "x" } }, { max_tokens = 7 })
    assert.same({ 7, nil }, { info.response.echo.max_completion_tokens, info.response.echo.max_tokens })
    -- errors: nil, message, info
    local t, msg, einfo = o:chat({ { role = "user", content = "x" } }, { model = "unknown" })
    assert.is_nil(t)
    assert.matches("HTTP 404", msg)
    assert.matches("does not exist", msg)
    assert.equal(404, einfo.status)
    o:close()
    oa:close()
  end)

  it("streams a chat and joins the deltas", function()
    local o = rl.http.openai{ base_url = base }
    local deltas = {}
    local text, info = o:chat{ messages = { { role = "user", content = "one two" } },
      stream = function(d) deltas[#deltas + 1] = d end }
    assert.equal("reply to: one two", text)
    assert.same({ "reply ", "to: ", "one ", "two" }, deltas)
    assert.same({ 4, "stop" }, { info.completion_tokens, info.finish_reason })
    o:close()
  end)

  it("completes prompts per profile", function()
    -- the mock's completion routes want token ids: a text prompt gets their 400, reported as such
    local t0, msg0 = rl.http.openai{ base_url = base, profile = "llamacpp" }:complete("hi", { max_tokens = 2 })
    assert.is_nil(t0)
    assert.matches("HTTP 400 from /completion: prompt must be token ids", msg0)
    local o = rl.http.openai{ base_url = base, profile = "vllm" }
    local t, msg = o:complete{ prompt = "hi" }
    assert.is_nil(t)
    assert.matches("HTTP 400 from /v1/completions: prompt must be token ids", msg)
    o:close()
  end)

  it("maps generate to each profile's token-in/token-out endpoint alike", function()
    local want_ids, want_lps = {}, {}
    local sum = 5 + 9 + 12
    for k = 0, 5 do
      want_ids[k + 1] = (31 * sum + 7 * k) % 1000 + 1
      want_lps[k + 1] = -(k + 1) / 8
    end
    for _, p in ipairs{ "vllm", "sglang", "llamacpp", "moonrl" } do
      local o = rl.http.openai{ base_url = base, profile = p }
      local g, msg = o:generate{ prompt_ids = { 5, 9, 12 }, max_tokens = 6, temperature = 1, seed = 3 }
      assert(g, p .. ": " .. tostring(msg))
      assert.same(want_ids, g.token_ids, p)
      assert.same(want_lps, g.logprobs, p)
      assert.equal("length", g.finish_reason, p)
      assert.equal(3, g.usage.prompt_tokens, p)
      for _, id in ipairs(g.token_ids) do assert.equal("integer", math.type(id)) end
      o:close()
    end
    local g, msg = rl.http.openai{ base_url = base, profile = "openai" }:generate{ prompt_ids = { 1 } }
    assert.is_nil(g)
    assert.matches("no token%-in/token%-out endpoint", msg)
    H.assert_error(function() rl.http.openai{ base_url = base, profile = "vllm" }:generate{ prompt_ids = {} } end,
      "prompt_ids: a non-empty list of token ids expected")
  end)

  it("puts SGLang's sampling options inside sampling_params, others beside it", function()
    local c = rl.http.client{ base_url = base }
    assert.equal(200, (c:get("/reset_stats")))
    local o = rl.http.openai{ base_url = base, profile = "sglang" }
    assert(o:generate{ prompt_ids = { 1, 2 }, max_tokens = 2, seed = 4,
                       extra = { ignore_eos = true, stop_token_ids = { 7 }, rid = "r1" } })
    o:close()
    local _, _, text = c:get("/requests")
    c:close()
    local sent
    for _, r in ipairs(json.decode(text).requests) do
      if r.path == "/generate" then sent = json.decode(r.body) end
    end
    assert.is_table(sent)
    assert.same({ 7 }, sent.sampling_params.stop_token_ids)
    assert.is_true(sent.sampling_params.ignore_eos)
    assert.equal(4, sent.sampling_params.sampling_seed)
    assert.equal(2, sent.sampling_params.max_new_tokens)
    assert.equal("r1", sent.rid)
    assert.is_nil(sent.stop_token_ids)
    assert.is_nil(sent.sampling_params.rid)
  end)

  it("serves a reward judge, with its batch of calls in flight at once", function()
    local o = rl.http.openai{ base_url = base, max_connections = 8 }
    local reqs = {}
    for i = 1, 6 do reqs[i] = { messages = { { role = "user", content = "q" .. i } }, opts = {} } end
    local res = o:batch(reqs)
    for i = 1, 6 do assert.equal("reply to: q" .. i, res[i][1]) end
    -- the judge terms of moonrl.reward accept it as their client
    assert.is_nil(require("moonrl.reward.judge").client_check(o))
    -- a failing call in a batch is that entry's nil, message, info
    res = o:batch{ { messages = { { role = "user", content = "x" } }, opts = { model = "unknown" } },
                   { messages = { { role = "user", content = "y" } }, opts = {} } }
    assert.is_nil(res[1][1])
    assert.equal(404, res[1][3].status)
    assert.equal("reply to: y", res[2][1])
    o:close()
  end)
end)
